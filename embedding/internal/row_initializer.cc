#include "embedding/internal/row_initializer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "embedding/dtype.h"
#include "embedding/row_math.h"

namespace tessera::embedding_internal {

RowInitializer::RowInitializer(const v1::TableConfig& config)
    : dim_(config.dim()),
      dtype_(config.dtype()),
      type_(config.initializer().type() == v1::INITIALIZER_UNSPECIFIED
                ? v1::UNIFORM
                : config.initializer().type()),
      scale_(config.initializer().has_scale() ? config.initializer().scale()
                                              : 1.0f / std::sqrt(static_cast<float>(config.dim()))),
      key_(embedding::row_math::InitKey(config.seed())) {}

void RowInitializer::InitialWeights(int64_t id, float* out) const {
  namespace row_math = embedding::row_math;
  const uint64_t base = row_math::InitBase(key_, id);
  switch (type_) {
    case v1::ZEROS:
      std::fill(out, out + dim_, 0.0f);
      break;
    case v1::NORMAL:
      for (int j = 0; j < dim_; j += 2) row_math::NormalInitialPair(base, j, dim_, scale_, out);
      break;
    default:
      for (int j = 0; j < dim_; ++j) out[j] = row_math::UniformInitial(base, j, scale_);
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
