#include "embedding/dtype.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "embedding/sharding.h"

namespace tessera::embedding {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
constexpr float kHalfMax = 65504.0f;

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

uint16_t Bf16Nearest(float f) {
  const uint32_t u = Bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Adds 16 random bits below bf16's last place and truncates: rounds up with probability
// equal to the dropped fraction.
uint16_t Bf16Stochastic(float f, uint32_t random16) {
  const uint32_t u = Bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u) return Bf16Nearest(f);  // Inf, NaN
  const uint32_t r = u + random16;
  // Rounding away must not carry a finite value into Inf: keep it truncated then.
  if ((r & 0x7f800000u) == 0x7f800000u) return static_cast<uint16_t>(u >> 16);
  return static_cast<uint16_t>(r >> 16);
}

_Float16 HalfNearest(float f) {
  if (std::isfinite(f) && std::fabs(f) > kHalfMax) f = std::copysign(kHalfMax, f);
  return static_cast<_Float16>(f);
}

uint16_t HalfBits(_Float16 h) { return std::bit_cast<uint16_t>(h); }
_Float16 HalfFromBits(uint16_t b) { return std::bit_cast<_Float16>(b); }

// The neighbour toward zero and the one away from zero (same sign, magnitude one unit
// in the last place larger); the latter with probability |f - toward| / ulp.
uint16_t HalfStochastic(float f, uint32_t random16) {
  if (!std::isfinite(f)) return HalfBits(static_cast<_Float16>(f));
  const _Float16 nearest = HalfNearest(f);
  uint16_t toward = HalfBits(nearest);
  if (std::fabs(static_cast<float>(nearest)) > std::fabs(f)) --toward;  // magnitude down
  const uint16_t away = static_cast<uint16_t>(toward + 1);
  if ((away & 0x7fffu) >= 0x7c00u) return toward;  // would be Inf: saturate
  const float lo = std::fabs(static_cast<float>(HalfFromBits(toward)));
  const float hi = std::fabs(static_cast<float>(HalfFromBits(away)));
  const float p = (std::fabs(f) - lo) / (hi - lo);
  return static_cast<float>(random16) * (1.0f / 65536.0f) < p ? away : toward;
}

}  // namespace

int DtypeBytes(v1::Dtype dtype) { return dtype == v1::FP16 || dtype == v1::BF16 ? 2 : 4; }

std::string DtypeName(v1::Dtype dtype) {
  switch (dtype) {
    case v1::FP16:
      return "fp16";
    case v1::BF16:
      return "bf16";
    default:
      return "fp32";
  }
}

absl::StatusOr<v1::Dtype> ParseDtypeName(absl::string_view name) {
  for (const v1::Dtype d : {v1::FP32, v1::FP16, v1::BF16}) {
    if (name == DtypeName(d)) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "': expected fp32, fp16 or bf16"));
}

void EncodeWeights(v1::Dtype dtype, const float* in, int n, void* out) {
  switch (dtype) {
    case v1::FP16: {
      auto* h = static_cast<_Float16*>(out);
      for (int i = 0; i < n; ++i) h[i] = HalfNearest(in[i]);
      break;
    }
    case v1::BF16: {
      auto* b = static_cast<uint16_t*>(out);
      for (int i = 0; i < n; ++i) b[i] = Bf16Nearest(in[i]);
      break;
    }
    default:
      std::memcpy(out, in, sizeof(float) * static_cast<size_t>(n));
  }
}

void EncodeWeightsStochastic(v1::Dtype dtype, const float* in, int n, uint64_t seed, void* out) {
  if (dtype != v1::FP16 && dtype != v1::BF16) {
    EncodeWeights(dtype, in, n, out);
    return;
  }
  auto* o = static_cast<uint16_t*>(out);
  uint64_t bits = 0;
  for (int i = 0; i < n; ++i) {
    if (i % 4 == 0) bits = Mix64(seed + static_cast<uint64_t>(i / 4 + 1) * kGolden);
    const uint32_t r = static_cast<uint32_t>(bits & 0xffffu);
    bits >>= 16;
    o[i] = dtype == v1::BF16 ? Bf16Stochastic(in[i], r) : HalfStochastic(in[i], r);
  }
}

void DecodeWeights(v1::Dtype dtype, const void* in, int n, float* out) {
  switch (dtype) {
    case v1::FP16: {
      const auto* h = static_cast<const _Float16*>(in);
      for (int i = 0; i < n; ++i) out[i] = static_cast<float>(h[i]);
      break;
    }
    case v1::BF16: {
      const auto* b = static_cast<const uint16_t*>(in);
      for (int i = 0; i < n; ++i) out[i] = std::bit_cast<float>(static_cast<uint32_t>(b[i]) << 16);
      break;
    }
    default:
      std::memcpy(out, in, sizeof(float) * static_cast<size_t>(n));
  }
}

}  // namespace tessera::embedding
