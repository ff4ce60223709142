#ifndef TESSERA_EMBEDDING_DEVICE_TABLE_CORE_H_
#define TESSERA_EMBEDDING_DEVICE_TABLE_CORE_H_

// The device table's work on one id, one row or one bag: what each thread of its kernels
// runs (device_table_kernels.cu), in plain C++ that nvcc compiles as __host__ __device__.
// Tests run the same functions on the CPU, a "thread" at a time, against the host
// EmbeddingTable, so CI checks the device table's logic without a GPU.
//
// A table is a hash map keyed by the full 64-bit id (collision-free, like the host
// table): open addressing with linear probing over its slots (ids hashed onto them by a
// multiply, not a division), a
// slot claimed by an atomic compare-and-swap of its key. Rows are structures of arrays:
// weights in the table's dtype, optimizer state in fp32, and per row its update count
// and last step. The one id equal to the empty key (-1) has a slot of its own past the
// probed ones. A row is never removed, so probing needs no tombstones.

#include <stdint.h>

#include "embedding/row_math.h"

#if defined(__CUDACC__)
#define TESSERA_HD __host__ __device__ inline
#else
#define TESSERA_HD inline
#endif

namespace tessera::embedding::device {

inline constexpr uint64_t kEmptyKey = ~uint64_t{0};  // the key of a free slot
inline constexpr uint64_t kProbeSalt = 0x243f6a8885a308d3ULL;

enum class StoredDtype : int32_t { kFp32, kFp16, kBf16 };

// Where a table's arrays are, and how its rows are made and updated. Plain values and
// pointers, passed to kernels by value.
struct TableView {
  uint64_t* keys = nullptr;            // (slots + 1): kEmptyKey when free
  void* weights = nullptr;             // (slots + 1, dim) in dtype
  float* state = nullptr;              // (slots + 1, state_floats)
  int64_t* update_count = nullptr;     // (slots + 1)
  int64_t* last_step = nullptr;        // (slots + 1)
  unsigned long long* rows = nullptr;  // (1) rows stored
  uint64_t slots = 0;                  // probed slots: max_rows / kMaxLoad, rounded up
  int32_t dim = 0;
  StoredDtype dtype = StoredDtype::kFp32;
  row_math::OptimizerKind optimizer = row_math::OptimizerKind::kAdagrad;
  int32_t state_floats = 0;
  row_math::Hyper hyper;
  float initial_accumulator = 0.0f;
  uint64_t init_key = 0;  // row_math::InitKey(table seed)
  int32_t init_type = 0;  // 0 uniform, 1 normal, 2 zeros
  float init_scale = 0.0f;
};

// ---- Atomics, on the device or on the host ----

TESSERA_HD uint64_t CompareAndSwap(uint64_t* p, uint64_t expected, uint64_t desired) {
#if defined(__CUDA_ARCH__)
  return atomicCAS(reinterpret_cast<unsigned long long*>(p),
                   static_cast<unsigned long long>(expected),
                   static_cast<unsigned long long>(desired));
#else
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  return expected;  // the value found
#endif
}

TESSERA_HD uint64_t LoadKey(const uint64_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const volatile unsigned long long*>(p);
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

TESSERA_HD void AddRows(unsigned long long* p, unsigned long long n) {
#if defined(__CUDA_ARCH__)
  atomicAdd(p, n);
#else
  __atomic_fetch_add(p, n, __ATOMIC_RELAXED);
#endif
}

// ---- The map ----

// The high 64 bits of a * b: a hash mapped onto [0, slots) without a division.
TESSERA_HD uint64_t MulHigh(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

TESSERA_HD uint64_t FirstSlot(const TableView& t, int64_t id) {
  return MulHigh(row_math::Mix(static_cast<uint64_t>(id) ^ kProbeSalt), t.slots);
}

TESSERA_HD uint64_t NextSlot(const TableView& t, uint64_t s) {
  return s + 1 == t.slots ? 0 : s + 1;
}

// The slot holding `id`, or -1.
TESSERA_HD int64_t FindSlot(const TableView& t, int64_t id) {
  const uint64_t key = static_cast<uint64_t>(id);
  if (key == kEmptyKey) return LoadKey(t.keys + t.slots) == 0 ? static_cast<int64_t>(t.slots) : -1;
  uint64_t s = FirstSlot(t, id);
  for (uint64_t probes = 0; probes < t.slots; ++probes) {
    const uint64_t k = LoadKey(t.keys + s);
    if (k == key) return static_cast<int64_t>(s);
    if (k == kEmptyKey) return -1;
    s = NextSlot(t, s);
  }
  return -1;
}

// The slot of `id`, claimed for it when it had none (*created then true); -1 when every
// slot is taken. Distinct ids may be claimed concurrently; one id by one thread at a time
// (callers deduplicate first).
TESSERA_HD int64_t ClaimSlot(const TableView& t, int64_t id, bool* created) {
  *created = false;
  const uint64_t key = static_cast<uint64_t>(id);
  if (key == kEmptyKey) {
    // The special slot's key is 0 once taken.
    *created = CompareAndSwap(t.keys + t.slots, kEmptyKey, 0) == kEmptyKey;
    return static_cast<int64_t>(t.slots);
  }
  uint64_t s = FirstSlot(t, id);
  for (uint64_t probes = 0; probes < t.slots; ++probes) {
    uint64_t k = LoadKey(t.keys + s);
    if (k == kEmptyKey) k = CompareAndSwap(t.keys + s, kEmptyKey, key);
    if (k == kEmptyKey) {
      *created = true;
      return static_cast<int64_t>(s);
    }
    if (k == key) return static_cast<int64_t>(s);
    s = NextSlot(t, s);
  }
  return -1;
}

// ---- Rows ----

TESSERA_HD float* StateOf(const TableView& t, int64_t slot) {
  return t.state + static_cast<uint64_t>(slot) * t.state_floats;
}

// Widens row `slot`'s weights into out (dim).
TESSERA_HD void ReadWeights(const TableView& t, int64_t slot, float* out) {
  const uint64_t base = static_cast<uint64_t>(slot) * t.dim;
  if (t.dtype == StoredDtype::kFp32) {
    const float* w = static_cast<const float*>(t.weights) + base;
    for (int j = 0; j < t.dim; ++j) out[j] = w[j];
    return;
  }
  const uint16_t* w = static_cast<const uint16_t*>(t.weights) + base;
  for (int j = 0; j < t.dim; ++j) {
    out[j] =
        t.dtype == StoredDtype::kFp16 ? row_math::HalfToFloat(w[j]) : row_math::Bf16ToFloat(w[j]);
  }
}

// Stores `w` (dim) as row `slot`'s weights: to nearest, or stochastically with `seed`.
TESSERA_HD void WriteWeights(const TableView& t, int64_t slot, const float* w, bool stochastic,
                             uint64_t seed) {
  const uint64_t base = static_cast<uint64_t>(slot) * t.dim;
  if (t.dtype == StoredDtype::kFp32) {
    float* out = static_cast<float*>(t.weights) + base;
    for (int j = 0; j < t.dim; ++j) out[j] = w[j];
    return;
  }
  uint16_t* out = static_cast<uint16_t*>(t.weights) + base;
  const bool half = t.dtype == StoredDtype::kFp16;
  for (int j = 0; j < t.dim; ++j) {
    if (stochastic) {
      const uint16_t bits = row_math::RoundingBits(seed, j);
      out[j] = half ? row_math::HalfStochastic(w[j], bits) : row_math::Bf16Stochastic(w[j], bits);
    } else {
      out[j] = half ? row_math::HalfNearest(w[j]) : row_math::Bf16Nearest(w[j]);
    }
  }
}

// The weights `id` starts with (dim), as a stored row of the table's dtype holds them:
// what a lookup of an id without a row answers, and what a new row stores.
TESSERA_HD void InitialWeights(const TableView& t, int64_t id, float* out) {
  const uint64_t base = row_math::InitBase(t.init_key, id);
  for (int j = 0; j < t.dim; ++j) {
    if (t.init_type == 2) {
      out[j] = 0.0f;
    } else if (t.init_type == 1) {
      if (j % 2 == 0) row_math::NormalInitialPair(base, j, t.dim, t.init_scale, out);
    } else {
      out[j] = row_math::UniformInitial(base, j, t.init_scale);
    }
  }
  if (t.dtype == StoredDtype::kFp32) return;
  for (int j = 0; j < t.dim; ++j) {
    out[j] = t.dtype == StoredDtype::kFp16 ? row_math::HalfToFloat(row_math::HalfNearest(out[j]))
                                           : row_math::Bf16ToFloat(row_math::Bf16Nearest(out[j]));
  }
}

// Fills a just-claimed row: initial weights, initial state, no updates; counts it.
// `scratch` holds dim floats.
TESSERA_HD void InitRow(const TableView& t, int64_t slot, int64_t id, float* scratch) {
  InitialWeights(t, id, scratch);
  WriteWeights(t, slot, scratch, false, 0);
  row_math::InitStateRow(t.optimizer, t.dim, t.initial_accumulator, StateOf(t, slot));
  t.update_count[slot] = 0;
  t.last_step[slot] = -1;  // never updated (RowMeta's default)
  AddRows(t.rows, 1);
}

// One optimizer step of row `slot` (of `id`) with its summed gradient `grad` (dim), at
// `step`, as the host table's update does it. `scratch` holds 2 * dim + state_floats
// floats. False, with the row unchanged, when the step would make a weight or a state
// value non-finite.
TESSERA_HD bool UpdateRow(const TableView& t, int64_t slot, int64_t id, const float* grad,
                          int64_t step, float* scratch) {
  const int d = t.dim;
  float* w = scratch;          // (d) widened weights
  float* g = scratch + d;      // (d) the gradient, preprocessed
  float* s = scratch + 2 * d;  // (state_floats) the state, updated
  ReadWeights(t, slot, w);
  for (int j = 0; j < d; ++j) g[j] = grad[j];
  float* stored_state = StateOf(t, slot);
  for (int j = 0; j < t.state_floats; ++j) s[j] = stored_state[j];
  const int64_t prior = t.update_count[slot];
  row_math::PreprocessRow(t.hyper, d, w, g);
  row_math::StepRow(t.optimizer, t.hyper, d, w, s, g, prior);
  for (int j = 0; j < d; ++j) {
    if (!row_math::Finite(w[j])) return false;
  }
  for (int j = 0; j < t.state_floats; ++j) {
    if (!row_math::Finite(s[j])) return false;
  }
  WriteWeights(t, slot, w, t.dtype != StoredDtype::kFp32,
               row_math::UpdateRoundingSeed(t.init_key, id, prior));
  for (int j = 0; j < t.state_floats; ++j) stored_state[j] = s[j];
  t.update_count[slot] = prior + 1;
  t.last_step[slot] = step;
  return true;
}

// ---- Rows in and out (checkpoints, export, import) ----

// Row `slot` as the host's rows travel: widened weights (dim), state (state_floats) and
// its counters.
TESSERA_HD void ExportRow(const TableView& t, int64_t slot, float* weights, float* state,
                          int64_t* update_count, int64_t* last_step) {
  ReadWeights(t, slot, weights);
  const float* s = StateOf(t, slot);
  for (int j = 0; j < t.state_floats; ++j) state[j] = s[j];
  *update_count = t.update_count[slot];
  *last_step = t.last_step[slot];
}

// Stores a row as given (weights rounded to nearest, as the host's PutRow stores them),
// claiming its slot when the id has none; false when the table is full.
TESSERA_HD bool ImportRow(const TableView& t, int64_t id, const float* weights, const float* state,
                          int64_t update_count, int64_t last_step) {
  bool created = false;
  const int64_t slot = ClaimSlot(t, id, &created);
  if (slot < 0) return false;
  WriteWeights(t, slot, weights, false, 0);
  float* s = StateOf(t, slot);
  for (int j = 0; j < t.state_floats; ++j) s[j] = state[j];
  t.update_count[slot] = update_count;
  t.last_step[slot] = last_step;
  if (created) AddRows(t.rows, 1);
  return true;
}

// ---- Pooling ----

// Column j of bag b: the (weighted) sum of its ids' rows in id order, then scaled (MEAN,
// SQRTN), as the host's PoolBags sums. `rows` (unique, dim) holds the distinct ids' rows,
// `inverse` each id's place among them; `weights` may be null.
TESSERA_HD float PoolColumn(const float* rows, int dim, const int32_t* inverse,
                            const int32_t* offsets, const float* weights,
                            row_math::PoolingKind pooling, int64_t b, int j) {
  const int32_t begin = offsets[b];
  const int32_t end = offsets[b + 1];
  float sum = 0.0f;
  for (int32_t k = begin; k < end; ++k) {
    const float w = weights == nullptr ? 1.0f : weights[k];
    sum += w * rows[static_cast<int64_t>(inverse[k]) * dim + j];
  }
  const float scale = row_math::BagScale(pooling, end - begin);
  return scale != 1.0f ? sum * scale : sum;
}

// Column j of the gradient of distinct id u: the sum, over its ids in position order, of
// their bags' gradients times their weight and scale, as the host's PoolBagsBackward
// sums. `positions` lists the positions of u's ids in ascending order (a stable sort by
// id gives them), `bag_of` each position's bag.
TESSERA_HD float UniqueGradColumn(const float* bag_grads, int dim, const int32_t* positions,
                                  int32_t count, const int32_t* bag_of, const int32_t* offsets,
                                  const float* weights, row_math::PoolingKind pooling, int j) {
  float sum = 0.0f;
  for (int32_t c = 0; c < count; ++c) {
    const int32_t k = positions[c];
    const int32_t b = bag_of[k];
    const float scale = row_math::BagScale(pooling, offsets[b + 1] - offsets[b]);
    const float w = (weights == nullptr ? 1.0f : weights[k]) * scale;
    sum += w * bag_grads[static_cast<int64_t>(b) * dim + j];
  }
  return sum;
}

}  // namespace tessera::embedding::device

#undef TESSERA_HD

#endif  // TESSERA_EMBEDDING_DEVICE_TABLE_CORE_H_
