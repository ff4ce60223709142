#ifndef TESSERA_EMBEDDING_ROW_MATH_H_
#define TESSERA_EMBEDDING_ROW_MATH_H_

// The arithmetic of one element of a row, defined once for every placement of a table:
// the host table's loops call these functions, and the device table's kernels (nvcc
// compiles them as __host__ __device__) call the same ones. So the CPU tests check the
// math a GPU runs. It covers:
// - the sparse optimizers' per-element updates (SGD, Adagrad, row-wise Adagrad, Adam,
//   FTRL) and the gradient's preprocessing (clipping, weight decay);
// - rounding to fp16 and bf16, to nearest and stochastically, and the random bits of
//   stochastic rounding;
// - the initial weights of a new row, a pure function of (table seed, id, column).
//
// Plain C++ only: no absl, no std:: functions the device lacks. Bit-identical across
// placements where the operations are: integer hashing, +, -, *, / and sqrt (correctly
// rounded on both). A device's powf, logf, cosf and sinf may differ from the host's in
// the last place (FTRL, and the NORMAL initializer), and its compiler may fuse a * b + c.

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define TESSERA_HD __host__ __device__ inline
#else
#define TESSERA_HD inline
#endif

namespace tessera::embedding::row_math {

inline constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

// The splitmix64 finaliser (embedding::Mix64 calls it).
TESSERA_HD constexpr uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

TESSERA_HD uint32_t Bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

TESSERA_HD float FromBits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

TESSERA_HD bool Finite(float f) { return (Bits(f) & 0x7f800000u) != 0x7f800000u; }

// ---- Optimizers: one element of a row ----

// Hyper-parameters as plain values, so a kernel can take them by value.
struct Hyper {
  float lr = 0.01f;
  float eps = 1e-10f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float l1 = 0.0f;
  float l2 = 0.0f;
  float lr_power = -0.5f;
  float clip_norm = 0.0f;     // 0 = off
  float clip_value = 0.0f;    // 0 = off
  float weight_decay = 0.0f;  // 0 = off
};

// Gradient preprocessing, in this order: ClipValue on each element; then, with the sum
// of the clipped elements' squares, NormScale on each; then WeightDecay on each.
TESSERA_HD float ClipValue(float g, float c) { return g < -c ? -c : (c < g ? c : g); }

// The factor that brings a gradient of squared norm `sq` down to clip_norm (1 when it is
// within it).
TESSERA_HD float NormScale(float sq, float clip_norm) {
  const float norm = sqrtf(sq);
  return norm > clip_norm ? clip_norm / norm : 1.0f;
}

TESSERA_HD float WeightDecay(float g, float w, float wd) { return g + wd * w; }

TESSERA_HD void SgdElement(float& w, float g, float lr) { w -= lr * g; }

// state: acc (dim).
TESSERA_HD void AdagradElement(float& w, float& acc, float g, float lr, float eps) {
  acc += g * g;
  w -= lr * g / (sqrtf(acc) + eps);
}

// state: one accumulator for the row, which grows by the mean of the squared gradient
// (its elements' squares summed in column order on the host).
TESSERA_HD float RowWiseAdagradScale(float& acc, float sum_sq, int dim, float lr, float eps) {
  acc += sum_sq / static_cast<float>(dim);
  return lr / (sqrtf(acc) + eps);
}

TESSERA_HD void RowWiseAdagradElement(float& w, float g, float scale) { w -= scale * g; }

// Adam's bias corrections for update number prior_updates + 1.
struct AdamCorrection {
  float c1;
  float c2;
};

TESSERA_HD AdamCorrection AdamCorrectionOf(float beta1, float beta2, int64_t prior_updates) {
  const double t = static_cast<double>(prior_updates + 1);
  return {static_cast<float>(1.0 - pow(static_cast<double>(beta1), t)),
          static_cast<float>(1.0 - pow(static_cast<double>(beta2), t))};
}

// state: m (dim), v (dim).
TESSERA_HD void AdamElement(float& w, float& m, float& v, float g, const Hyper& h,
                            AdamCorrection c) {
  m = h.beta1 * m + (1.0f - h.beta1) * g;
  v = h.beta2 * v + (1.0f - h.beta2) * g * g;
  const float m_hat = m / c.c1;
  const float v_hat = v / c.c2;
  w -= h.lr * m_hat / (sqrtf(v_hat) + h.eps);
}

// FTRL-Proximal (McMahan et al. 2013) with a general learning-rate power p:
//   n' = n + g^2;  sigma = (n'^-p - n^-p) / lr;  z += g - sigma * w;
//   w = |z| <= l1 ? 0 : (sign(z) * l1 - z) / (n'^-p / lr + 2 * l2).
// state: z (dim), n (dim).
TESSERA_HD void FtrlElement(float& w, float& z, float& n, float g, const Hyper& h) {
  const float n_new = n + g * g;
  const float pow_new = powf(n_new, -h.lr_power);
  const float pow_old = n > 0.0f ? powf(n, -h.lr_power) : 0.0f;
  const float sigma = (pow_new - pow_old) / h.lr;
  z += g - sigma * w;
  n = n_new;
  if (fabsf(z) <= h.l1) {
    w = 0.0f;
  } else {
    const float sign = z > 0.0f ? 1.0f : -1.0f;
    w = (sign * h.l1 - z) / (pow_new / h.lr + 2.0f * h.l2);
  }
}

// ---- Optimizers: a whole row ----
// How a table without vector units (a device kernel's thread, or a test) composes the
// element functions for one row; the host's Optimizer classes run the same loops
// (row_math_test checks them bit for bit).

enum class OptimizerKind : int32_t { kSgd, kAdagrad, kRowWiseAdagrad, kAdam, kFtrl };

// Floats of optimizer state per row, stored apart from the weights.
TESSERA_HD int StateFloatsOf(OptimizerKind kind, int dim) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return 0;
    case OptimizerKind::kRowWiseAdagrad:
      return 1;
    case OptimizerKind::kAdagrad:
      return dim;
    default:
      return 2 * dim;  // Adam: m, v; FTRL: z, n
  }
}

// A new row's state.
TESSERA_HD void InitStateRow(OptimizerKind kind, int dim, float initial_accumulator, float* state) {
  const int n = StateFloatsOf(kind, dim);
  for (int i = 0; i < n; ++i) {
    const bool accumulator = kind == OptimizerKind::kAdagrad ||
                             kind == OptimizerKind::kRowWiseAdagrad ||
                             (kind == OptimizerKind::kFtrl && i >= dim);
    state[i] = accumulator ? initial_accumulator : 0.0f;
  }
}

// Clipping and weight decay of the summed gradient `g` (dim), in place.
TESSERA_HD void PreprocessRow(const Hyper& h, int dim, const float* w, float* g) {
  if (h.clip_value > 0.0f) {
    for (int i = 0; i < dim; ++i) g[i] = ClipValue(g[i], h.clip_value);
  }
  if (h.clip_norm > 0.0f) {
    float sq = 0.0f;
    for (int i = 0; i < dim; ++i) sq += g[i] * g[i];
    const float scale = NormScale(sq, h.clip_norm);
    if (scale != 1.0f) {
      for (int i = 0; i < dim; ++i) g[i] *= scale;
    }
  }
  if (h.weight_decay > 0.0f) {
    for (int i = 0; i < dim; ++i) g[i] = WeightDecay(g[i], w[i], h.weight_decay);
  }
}

// The update proper of one row on a preprocessed gradient; prior_updates is the row's
// update count before it (Adam's t - 1).
TESSERA_HD void StepRow(OptimizerKind kind, const Hyper& h, int dim, float* w, float* s,
                        const float* g, int64_t prior_updates) {
  switch (kind) {
    case OptimizerKind::kSgd:
      for (int i = 0; i < dim; ++i) SgdElement(w[i], g[i], h.lr);
      break;
    case OptimizerKind::kAdagrad:
      for (int i = 0; i < dim; ++i) AdagradElement(w[i], s[i], g[i], h.lr, h.eps);
      break;
    case OptimizerKind::kRowWiseAdagrad: {
      float sq = 0.0f;
      for (int i = 0; i < dim; ++i) sq += g[i] * g[i];
      const float scale = RowWiseAdagradScale(s[0], sq, dim, h.lr, h.eps);
      for (int i = 0; i < dim; ++i) RowWiseAdagradElement(w[i], g[i], scale);
      break;
    }
    case OptimizerKind::kAdam: {
      const AdamCorrection c = AdamCorrectionOf(h.beta1, h.beta2, prior_updates);
      for (int i = 0; i < dim; ++i) AdamElement(w[i], s[i], s[dim + i], g[i], h, c);
      break;
    }
    case OptimizerKind::kFtrl:
      for (int i = 0; i < dim; ++i) FtrlElement(w[i], s[i], s[dim + i], g[i], h);
      break;
  }
}

// ---- Pooling ----

enum class PoolingKind : int32_t { kSum, kMean, kSqrtN };

// The factor a bag of n ids is scaled by after its (weighted) sum: 1 / n for MEAN,
// 1 / sqrt(n) for SQRTN, 1 for SUM and for an empty bag.
TESSERA_HD float BagScale(PoolingKind kind, int32_t n) {
  if (n <= 0 || kind == PoolingKind::kSum) return 1.0f;
  const float count = static_cast<float>(n);
  return kind == PoolingKind::kMean ? 1.0f / count : 1.0f / sqrtf(count);
}

// ---- Stored dtypes ----

TESSERA_HD float Bf16ToFloat(uint16_t b) { return FromBits(static_cast<uint32_t>(b) << 16); }

TESSERA_HD uint16_t Bf16Nearest(float f) {
  const uint32_t u = Bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Adds `random` below bf16's last place and truncates: up with probability equal to the
// dropped fraction. Inf and NaN stay (NaN quieted); a carry into Inf is dropped.
// Branch-free, so the host's loop over a row vectorises.
TESSERA_HD uint16_t Bf16Stochastic(float f, uint16_t random) {
  const uint32_t u = Bits(f);
  const uint32_t r = u + random;
  const bool special = (u & 0x7f800000u) == 0x7f800000u;
  const bool overflow = (r & 0x7f800000u) == 0x7f800000u;
  const uint32_t nan_bit = (u & 0x7fffffffu) > 0x7f800000u ? 0x40u : 0u;
  return static_cast<uint16_t>(((special || overflow ? u : r) >> 16) | nan_bit);
}

inline constexpr float kHalfMax = 65504.0f;
inline constexpr float kHalfMinNormal = 0x1p-14f;

// IEEE binary16: round to nearest, ties to even; overflow gives Inf.
TESSERA_HD uint16_t HalfFromFloatBits(float f) {
  const uint32_t x = Bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {
    return static_cast<uint16_t>(sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: Inf
  if (abs < 0x38800000u) {
    // Below 2^-14: a subnormal half, in units of 2^-24 (exact scaling, then rounding to
    // nearest even; 1024 units carry into the smallest normal, as they should).
    const float units = nearbyintf(FromBits(abs) * 16777216.0f);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(units));
  }
  uint32_t h = (abs - 0x38000000u) >> 13;  // rebias the exponent (127 - 15), keep 10 bits
  const uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

TESSERA_HD float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return FromBits(sign | 0x7f800000u | (man << 13));
  return FromBits(sign | ((exp + 112) << 23) | (man << 13));
}

// Nearest, with finite values beyond the range saturated at +-65504.
TESSERA_HD uint16_t HalfNearest(float f) {
  if (Finite(f) && fabsf(f) > kHalfMax) f = copysignf(kHalfMax, f);
  return HalfFromFloatBits(f);
}

// fp16 keeps 13 fewer significand bits than fp32 in its normal range: adding 13 random
// bits below its last place and truncating toward zero rounds up with probability equal
// to the dropped fraction. Values beyond the range saturate (truncation stops at 65504).
// Only for finite |f| >= kHalfMinNormal.
TESSERA_HD uint16_t HalfStochasticNormal(float f, uint16_t random) {
  const float y = FromBits(Bits(f) + (static_cast<uint32_t>(random) >> 3));
  uint16_t toward = HalfNearest(y);
  if (fabsf(HalfToFloat(toward)) > fabsf(y)) --toward;  // magnitude down
  return toward;
}

// Any value: in fp16's subnormal range (fewer significand bits still) the neighbour
// toward zero or the one away from it, the latter with probability |f - toward| / ulp.
TESSERA_HD uint16_t HalfStochastic(float f, uint16_t random) {
  if (!Finite(f)) return HalfFromFloatBits(f);
  if (fabsf(f) >= kHalfMinNormal) return HalfStochasticNormal(f, random);
  uint16_t toward = HalfNearest(f);
  if (fabsf(HalfToFloat(toward)) > fabsf(f)) --toward;  // magnitude down
  const uint16_t away = static_cast<uint16_t>(toward + 1);
  if ((away & 0x7fffu) >= 0x7c00u) return toward;  // would be Inf: saturate
  const float lo = fabsf(HalfToFloat(toward));
  const float hi = fabsf(HalfToFloat(away));
  const float p = (fabsf(f) - lo) / (hi - lo);
  return static_cast<float>(random) * (1.0f / 65536.0f) < p ? away : toward;
}

// The random bits of stochastic rounding: 64 bits per `word`, four elements' 16 each
// (element i takes bits 16 * (i % 4) of word i / 4).
TESSERA_HD uint64_t RoundingWord(uint64_t seed, int word) {
  return Mix(seed + static_cast<uint64_t>(word + 1) * kGolden);
}

TESSERA_HD uint16_t RoundingBits(uint64_t seed, int i) {
  return static_cast<uint16_t>(RoundingWord(seed, i / 4) >> (16 * (i % 4)));
}

// The seed of a row's rounding in its update number prior_updates + 1, for a table of
// initializer key `key`.
TESSERA_HD uint64_t UpdateRoundingSeed(uint64_t key, int64_t id, int64_t prior_updates) {
  return Mix(key ^ Mix(static_cast<uint64_t>(id)) ^
             (static_cast<uint64_t>(prior_updates) * kGolden));
}

// ---- Initial weights ----

inline constexpr uint64_t kInitSalt = 0x6a09e667f3bcc908ULL;

// The table's key for per-row random bits, from its seed.
TESSERA_HD uint64_t InitKey(uint64_t table_seed) { return Mix(table_seed ^ kInitSalt); }

// A row's base for its columns' bits, and column j's bits.
TESSERA_HD uint64_t InitBase(uint64_t key, int64_t id) {
  return Mix(key ^ static_cast<uint64_t>(id));
}
TESSERA_HD uint64_t InitBits(uint64_t base, int j) {
  return Mix(base + static_cast<uint64_t>(j + 1) * kGolden);
}

// Uniform in [0, 1) from the top 24 bits.
TESSERA_HD float UnitFloat(uint64_t bits) {
  return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
}

// UNIFORM: column j of the row of base `base`, in [-scale, scale).
TESSERA_HD float UniformInitial(uint64_t base, int j, float scale) {
  return (2.0f * UnitFloat(InitBits(base, j)) - 1.0f) * scale;
}

// NORMAL: Box-Muller over pairs of columns (j even): writes columns j and, when j + 1 <
// dim, j + 1. u1 is kept away from 0.
TESSERA_HD void NormalInitialPair(uint64_t base, int j, int dim, float scale, float* out) {
  const float u1 = UnitFloat(InitBits(base, j)) + 0.5f / 16777216.0f;
  const float u2 = UnitFloat(InitBits(base, j + 1));
  const float r = sqrtf(-2.0f * logf(u1)) * scale;
  const float theta = 2.0f * 3.14159265358979323846f * u2;
  out[j] = r * cosf(theta);
  if (j + 1 < dim) out[j + 1] = r * sinf(theta);
}

}  // namespace tessera::embedding::row_math

#undef TESSERA_HD

#endif  // TESSERA_EMBEDDING_ROW_MATH_H_
