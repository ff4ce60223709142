#include "embedding/dtype.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "embedding/sharding.h"

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#define TESSERA_F16C 1
#endif

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

// IEEE binary16 in software, for compilers without _Float16 (clang 14 on x86) and the
// scalar tails of the F16C loops: round to nearest, ties to even; overflow gives Inf.
uint16_t HalfFromFloatBits(float f) {
  const uint32_t x = Bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return static_cast<uint16_t>(sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: Inf
  if (abs < 0x38800000u) {
    // Below 2^-14: a subnormal half, in units of 2^-24 (exact scaling, then rounding to
    // nearest even; 1024 units carry into the smallest normal, as they should).
    const float units = std::nearbyint(std::bit_cast<float>(abs) * 16777216.0f);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(units));
  }
  uint32_t h = (abs - 0x38000000u) >> 13;  // rebias the exponent (127 - 15), keep 10 bits
  const uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

// Nearest, with finite values beyond the range saturated at +-65504.
uint16_t HalfNearest(float f) {
  if (std::isfinite(f) && std::fabs(f) > kHalfMax) f = std::copysign(kHalfMax, f);
  return HalfFromFloatBits(f);
}

// Compilers do not vectorise the conversions: F16C does eight at a time.
void EncodeHalfNearest(const float* in, int n, uint16_t* out) {
  int i = 0;
#ifdef TESSERA_F16C
  const __m256 hi = _mm256_set1_ps(kHalfMax);
  const __m256 lo = _mm256_set1_ps(-kHalfMax);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(INFINITY);
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(in + i);
    // min/max return their second operand when one is NaN, so NaN passes through; Inf is
    // kept as it is, finite values beyond the range saturate.
    const __m256 clamped = _mm256_max_ps(lo, _mm256_min_ps(hi, x));
    const __m256 is_inf = _mm256_cmp_ps(_mm256_and_ps(x, abs_mask), inf, _CMP_EQ_OQ);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_blendv_ps(clamped, x, is_inf),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
#endif
  for (; i < n; ++i) out[i] = HalfNearest(in[i]);
}

void DecodeHalf(const uint16_t* in, int n, float* out) {
  int i = 0;
#ifdef TESSERA_F16C
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) out[i] = HalfToFloat(in[i]);
}

constexpr float kHalfMinNormal = 0x1p-14f;

// fp16 keeps 13 fewer significand bits than fp32 in its normal range: adding 13 random
// bits below its last place and truncating toward zero rounds up with probability equal
// to the dropped fraction. Values beyond the range saturate (truncation stops at 65504).
// Only for finite |f| >= kHalfMinNormal.
uint16_t HalfStochasticNormal(float f, uint32_t random16) {
  const float y = std::bit_cast<float>(Bits(f) + (random16 >> 3));
  uint16_t toward = HalfNearest(y);
  if (std::fabs(HalfToFloat(toward)) > std::fabs(y)) --toward;  // magnitude down
  return toward;
}

// Any value: in fp16's subnormal range (fewer significand bits still) the neighbour
// toward zero or the one away from it, the latter with probability |f - toward| / ulp.
uint16_t HalfStochastic(float f, uint32_t random16) {
  if (!std::isfinite(f)) return HalfFromFloatBits(f);
  if (std::fabs(f) >= kHalfMinNormal) return HalfStochasticNormal(f, random16);
  uint16_t toward = HalfNearest(f);
  if (std::fabs(HalfToFloat(toward)) > std::fabs(f)) --toward;  // magnitude down
  const uint16_t away = static_cast<uint16_t>(toward + 1);
  if ((away & 0x7fffu) >= 0x7c00u) return toward;  // would be Inf: saturate
  const float lo = std::fabs(HalfToFloat(toward));
  const float hi = std::fabs(HalfToFloat(away));
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
  const std::string lower = absl::AsciiStrToLower(name);  // "BF16" as the proto spells it
  for (const v1::Dtype d : {v1::FP32, v1::FP16, v1::BF16}) {
    if (lower == DtypeName(d)) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "': expected fp32, fp16 or bf16"));
}

void EncodeWeights(v1::Dtype dtype, const float* in, int n, void* out) {
  switch (dtype) {
    case v1::FP16: {
      EncodeHalfNearest(in, n, static_cast<uint16_t*>(out));
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
  // 16 random bits per value, four from each 64-bit draw.
  constexpr int kMaxOnStack = 1024;
  uint16_t stack_bits[kMaxOnStack];
  std::vector<uint16_t> heap_bits;
  uint16_t* random = stack_bits;
  if (n > kMaxOnStack - 3) {
    heap_bits.resize(static_cast<size_t>(n) + 3);
    random = heap_bits.data();
  }
  for (int i = 0; i < n; i += 4) {
    const uint64_t bits = Mix64(seed + static_cast<uint64_t>(i / 4 + 1) * kGolden);
    std::memcpy(random + i, &bits, sizeof(bits));  // little-endian: the low 16 bits first
  }
  auto* o = static_cast<uint16_t*>(out);
  if (dtype == v1::BF16) {
    // Branch-free, so the loop vectorises: add the random bits below bf16's last place
    // and truncate; Inf and NaN stay (NaN quieted), and a carry into Inf is dropped.
    for (int i = 0; i < n; ++i) {
      const uint32_t u = Bits(in[i]);
      const uint32_t r = u + random[i];
      const bool special = (u & 0x7f800000u) == 0x7f800000u;
      const bool overflow = (r & 0x7f800000u) == 0x7f800000u;
      const uint32_t nan_bit = (u & 0x7fffffffu) > 0x7f800000u ? 0x40u : 0u;
      o[i] = static_cast<uint16_t>(((special || overflow ? u : r) >> 16) | nan_bit);
    }
    return;
  }
  int i = 0;
#ifdef TESSERA_F16C
  // Eight at a time, as HalfStochasticNormal does; lanes outside the normal range are
  // redone one by one.
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 min_normal = _mm256_set1_ps(kHalfMinNormal);
  const __m256 inf = _mm256_set1_ps(INFINITY);
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(in + i);
    const __m256i r = _mm256_srli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(random + i))), 3);
    const __m256 y = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(x), r));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i),
                     _mm256_cvtps_ph(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC));
    const __m256 ax = _mm256_and_ps(x, abs_mask);
    // Not (min_normal <= |x| < Inf): subnormal range, zero, Inf or NaN.
    const __m256 normal = _mm256_and_ps(_mm256_cmp_ps(ax, min_normal, _CMP_GE_OQ),
                                        _mm256_cmp_ps(ax, inf, _CMP_LT_OQ));
    int odd = ~_mm256_movemask_ps(normal) & 0xff;
    while (odd != 0) {
      const int lane = std::countr_zero(static_cast<unsigned>(odd));
      o[i + lane] = HalfStochastic(in[i + lane], random[i + lane]);
      odd &= odd - 1;
    }
  }
#endif
  for (; i < n; ++i) o[i] = HalfStochastic(in[i], random[i]);
}

void DecodeWeights(v1::Dtype dtype, const void* in, int n, float* out) {
  switch (dtype) {
    case v1::FP16: {
      DecodeHalf(static_cast<const uint16_t*>(in), n, out);
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
