#ifndef TESSERA_BASE_CRC32C_H_
#define TESSERA_BASE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace tessera::base {

// CRC-32C (Castagnoli) of `n` bytes, continuing from `crc` (0 to start). Uses the SSE4.2
// instruction when the build targets it, a table otherwise; both give the same value.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace tessera::base

#endif  // TESSERA_BASE_CRC32C_H_
