#include "embedding/dtype.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "embedding/row_math.h"

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#define TESSERA_F16C 1
#endif

namespace tessera::embedding {
namespace {

using row_math::Bits;
using row_math::HalfNearest;
using row_math::HalfStochastic;
using row_math::HalfToFloat;
using row_math::kHalfMax;
using row_math::kHalfMinNormal;

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
      for (int i = 0; i < n; ++i) b[i] = row_math::Bf16Nearest(in[i]);
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
    // row_math::RoundingBits(seed, i + k) for k < 4: little-endian, the low 16 bits first.
    const uint64_t bits = row_math::RoundingWord(seed, i / 4);
    std::memcpy(random + i, &bits, sizeof(bits));
  }
  auto* o = static_cast<uint16_t*>(out);
  if (dtype == v1::BF16) {
    for (int i = 0; i < n; ++i) o[i] = row_math::Bf16Stochastic(in[i], random[i]);
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
      for (int i = 0; i < n; ++i) out[i] = row_math::Bf16ToFloat(b[i]);
      break;
    }
    default:
      std::memcpy(out, in, sizeof(float) * static_cast<size_t>(n));
  }
}

}  // namespace tessera::embedding
