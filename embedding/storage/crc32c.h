#ifndef TESSERA_EMBEDDING_STORAGE_CRC32C_H_
#define TESSERA_EMBEDDING_STORAGE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace tessera::storage {

// CRC-32C (Castagnoli) of `n` bytes, continuing from `crc` (0 to start). Uses the SSE4.2
// instruction when the build targets it, a table otherwise; both give the same value.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace tessera::storage

#endif  // TESSERA_EMBEDDING_STORAGE_CRC32C_H_
