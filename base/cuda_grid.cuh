#ifndef TESSERA_BASE_CUDA_GRID_CUH_
#define TESSERA_BASE_CUDA_GRID_CUH_

// Grid-stride loops for CUDA kernels (.cu files only): a kernel over n elements launches
// GridBlocks(n) blocks of kGridThreads and walks its elements with TESSERA_GRID_LOOP.

#include <cstddef>

namespace tessera::base {

inline constexpr int kGridThreads = 256;

// Blocks for n elements: at least 1, at most 65535 (the loop covers the rest).
inline int GridBlocks(size_t n) {
  const size_t blocks = (n + kGridThreads - 1) / kGridThreads;
  return static_cast<int>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

}  // namespace tessera::base

#define TESSERA_GRID_LOOP(i, n)                                                        \
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<size_t>(gridDim.x) * blockDim.x)

#endif  // TESSERA_BASE_CUDA_GRID_CUH_
