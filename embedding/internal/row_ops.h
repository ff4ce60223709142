#ifndef TESSERA_EMBEDDING_INTERNAL_ROW_OPS_H_
#define TESSERA_EMBEDDING_INTERNAL_ROW_OPS_H_

// Small row operations the table's hot loops share (dynamic and fixed-vocabulary rows).

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "embedding/prefetch.h"

namespace tessera::embedding_internal {

// The prefetches (embedding/prefetch.h), by their short names here.
using embedding::PrefetchBytes;
using embedding::PrefetchLine;
using embedding::PrefetchLines;

// Copies `n` floats with vector loads and stores in line: a row is a few of them, and
// the library call a copy loop would otherwise become costs more than the copy.
inline void CopyFloats(float* dst, const float* src, int n) {
#if defined(__AVX512F__)
  int j = 0;
  for (; j + 16 <= n; j += 16) _mm512_storeu_ps(dst + j, _mm512_loadu_ps(src + j));
  if (j < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - j)) - 1);
    _mm512_mask_storeu_ps(dst + j, tail, _mm512_maskz_loadu_ps(tail, src + j));
  }
#elif defined(__SSE2__)
  int j = 0;
#if defined(__AVX__)
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(dst + j, _mm256_loadu_ps(src + j));
#endif
  for (; j + 4 <= n; j += 4) _mm_storeu_ps(dst + j, _mm_loadu_ps(src + j));
  for (; j < n; ++j) _mm_store_ss(dst + j, _mm_load_ss(src + j));
#else
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
#endif
}

// True when any of the `n` floats at `p` has a bit set (is not +0.0).
inline bool AnyBits(const float* p, int n) {
#if defined(__AVX512F__)
  __m512i any = _mm512_setzero_si512();
  int j = 0;
  for (; j + 16 <= n; j += 16) any = _mm512_or_si512(any, _mm512_loadu_si512(p + j));
  if (j < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - j)) - 1);
    any = _mm512_or_si512(any, _mm512_maskz_loadu_epi32(tail, p + j));
  }
  return _mm512_test_epi32_mask(any, any) != 0;
#else
  uint32_t any = 0;
  for (int j = 0; j < n; ++j) {
    uint32_t bits;
    std::memcpy(&bits, p + j, sizeof(bits));
    any |= bits;
  }
  return any != 0;
#endif
}

// A short wait while a writer holds a stripe.
inline void SpinPause() {
  for (int spin = 0; spin < 32; ++spin) {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
  }
}

// 0 for Inf and NaN, nonzero for a finite value: Inf and NaN have an exponent of all ones,
// so ~bits & exponent is 0 for them alone. The least of these over values is 0 when any
// is not finite: a min over integers, which vectorises (a float reduction would be a
// serial chain).
constexpr uint32_t kFiniteBitsAll = 0x7f800000u;  // the least over no values
inline uint32_t FiniteBits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return ~bits & kFiniteBitsAll;
}

// True when every value of p[0, n) is finite.
inline bool AllFinite(const float* p, size_t n) {
  uint32_t least = kFiniteBitsAll;
  for (size_t i = 0; i < n; ++i) least = std::min(least, FiniteBits(p[i]));
  return least != 0;
}

}  // namespace tessera::embedding_internal

#endif  // TESSERA_EMBEDDING_INTERNAL_ROW_OPS_H_
