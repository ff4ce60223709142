#include "embedding/internal/row_initializer.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "embedding/dtype.h"
#include "embedding/sharding.h"

namespace tessera::embedding_internal {
namespace {

constexpr uint64_t kInitSalt = 0x6a09e667f3bcc908ULL;
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

// Uniform in [0, 1) from the top 24 bits.
float UnitFloat(uint64_t bits) { return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f); }

}  // namespace

RowInitializer::RowInitializer(const v1::TableConfig& config)
    : dim_(config.dim()),
      dtype_(config.dtype()),
      type_(config.initializer().type() == v1::INITIALIZER_UNSPECIFIED
                ? v1::UNIFORM
                : config.initializer().type()),
      scale_(config.initializer().has_scale() ? config.initializer().scale()
                                              : 1.0f / std::sqrt(static_cast<float>(config.dim()))),
      key_(embedding::Mix64(config.seed() ^ kInitSalt)) {}

void RowInitializer::InitialWeights(int64_t id, float* out) const {
  const uint64_t base = embedding::Mix64(key_ ^ static_cast<uint64_t>(id));
  auto bits = [base](int j) {
    return embedding::Mix64(base + static_cast<uint64_t>(j + 1) * kGolden);
  };
  switch (type_) {
    case v1::ZEROS:
      std::fill(out, out + dim_, 0.0f);
      break;
    case v1::NORMAL:
      // Box-Muller over pairs of columns; u1 is kept away from 0.
      for (int j = 0; j < dim_; j += 2) {
        const float u1 = UnitFloat(bits(j)) + 0.5f / 16777216.0f;
        const float u2 = UnitFloat(bits(j + 1));
        const float r = std::sqrt(-2.0f * std::log(u1)) * scale_;
        const float theta = 2.0f * std::numbers::pi_v<float> * u2;
        out[j] = r * std::cos(theta);
        if (j + 1 < dim_) out[j + 1] = r * std::sin(theta);
      }
      break;
    default:
      for (int j = 0; j < dim_; ++j) out[j] = (2.0f * UnitFloat(bits(j)) - 1.0f) * scale_;
      break;
  }
  if (dtype_ != v1::FP32) {
    // What a stored row of this dtype holds.
    thread_local std::vector<uint16_t> half;
    half.resize(dim_);
    embedding::EncodeWeights(dtype_, out, dim_, half.data());
    embedding::DecodeWeights(dtype_, half.data(), dim_, out);
  }
}

}  // namespace tessera::embedding_internal
