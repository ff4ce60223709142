#ifndef TESSERA_EMBEDDING_PREFETCH_H_
#define TESSERA_EMBEDDING_PREFETCH_H_

// Software prefetches of rows, as the table's gather issues them: public, so that a
// baseline measured beside the table (benchmarks/embedding_benchmark.cc) prefetches the
// same way.

#include <cstdint>

namespace tessera::embedding {

// Prefetches the line holding `p`. (The empty asm keeps a loop of these: a loop of
// prefetches alone counts as free of effects, and GCC deletes it.) A read goes to the L2
// cache (prefetcht1), not the L1: a gather's prefetches of many rows ahead then wait on
// the L2's many miss buffers instead of the L1's few, which stalled the loop that issued
// them (a dynamic table's gather from 2.5 GiB of dim-64 rows: 0.48-0.53x of torch's
// embedding_bag with prefetcht0, 0.59x with prefetcht1; benchmarks/gather_vs_torch.py).
inline void PrefetchLine(const void* p, bool for_write) {
  if (for_write) {
    __builtin_prefetch(p, 1, 3);
  } else {
    __builtin_prefetch(p, 0, 2);
  }
  asm volatile("");
}

inline void PrefetchLines(const float* p, int lines, bool for_write) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int l = 0; l < lines; ++l) PrefetchLine(c + 64 * l, for_write);
}

// Prefetches the cache lines of [p, p + bytes).
inline void PrefetchBytes(const void* p, int bytes, bool for_write) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes);
  for (uintptr_t a = begin; a < end; a += 64)
    PrefetchLine(reinterpret_cast<const void*>(a), for_write);
}

}  // namespace tessera::embedding

#endif  // TESSERA_EMBEDDING_PREFETCH_H_
