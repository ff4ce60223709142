#ifndef TESSERA_BENCHMARKS_MEMCPY_CEILING_H_
#define TESSERA_BENCHMARKS_MEMCPY_CEILING_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <vector>

namespace tessera::bench {

// The memory ceiling every benchmark reports its table operations against (vs_memcpy):
// memcpy bytes/s copying `chunk` bytes at a time from random places in a buffer of
// `region` bytes (at least twice the chunk, at most 1 GiB), measured for 0.2 s in the
// same run. The last answer is kept for the same (region, chunk). 0 for an empty chunk.
inline double MemcpyBytesPerSecond(int64_t region, int64_t chunk) {
  static std::mutex mu;
  static int64_t cached_region = -1, cached_chunk = -1;
  static double cached = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (chunk <= 0) return 0;
  if (region == cached_region && chunk == cached_chunk) return cached;
  const int64_t size = std::max<int64_t>(std::min<int64_t>(region, int64_t{1} << 30), 2 * chunk);
  std::vector<char> src(size, 1), dst(chunk);
  std::mt19937_64 rng(5);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  int64_t moved = 0;
  double seconds = 0;
  while (seconds < 0.2) {
    for (int k = 0; k < 16; ++k) {
      const int64_t at = static_cast<int64_t>(rng() % static_cast<uint64_t>(size - chunk + 1));
      std::memcpy(dst.data(), src.data() + at, chunk);
      moved += chunk;
    }
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
  }
  volatile char sink = dst[static_cast<size_t>(rng() % static_cast<uint64_t>(chunk))];
  (void)sink;  // keeps the copies from being optimised away
  cached_region = region;
  cached_chunk = chunk;
  cached = moved / seconds;
  return cached;
}

}  // namespace tessera::bench

#endif  // TESSERA_BENCHMARKS_MEMCPY_CEILING_H_
