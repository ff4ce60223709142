#ifndef TESSERA_EMBEDDING_INTERNAL_ALIGNED_BLOCK_H_
#define TESSERA_EMBEDDING_INTERNAL_ALIGNED_BLOCK_H_

// 64-byte-aligned memory for a table's rows and id maps. Blocks of 2 MiB or more come
// from mmap, 2 MiB aligned and advised for transparent huge pages: random rows over
// gigabytes would otherwise miss the TLB on nearly every access, and the kernel hands out
// zeroed pages as they are first touched instead of a memset over the whole block.

#include <cstddef>

namespace tessera::embedding_internal {

class AlignedBlock {
 public:
  AlignedBlock() = default;
  // `bytes` bytes, zero-filled unless `zeroed` is false (smaller blocks then hold
  // whatever the allocator gives: for rows that are written before they are read);
  // empty() when out of memory.
  explicit AlignedBlock(size_t bytes, bool zeroed = true);
  // `bytes` bytes mapped from the kernel whatever the size: zero, and resident only as
  // pages are first touched (memory grows with the rows written, not the block's size).
  // `huge`: 2 MiB aligned, its whole 2 MiB pages advised for transparent huge pages (then
  // resident 2 MiB at a time; a tail of less than that in small pages).
  // empty() when out of address space.
  static AlignedBlock Lazy(size_t bytes, bool huge);
  ~AlignedBlock();
  AlignedBlock(AlignedBlock&& other) noexcept;
  AlignedBlock& operator=(AlignedBlock&& other) noexcept;
  AlignedBlock(const AlignedBlock&) = delete;
  AlignedBlock& operator=(const AlignedBlock&) = delete;

  void* data() const { return data_; }
  // Bytes reserved (the request rounded up to the allocation's granule).
  size_t bytes() const { return bytes_; }
  bool empty() const { return data_ == nullptr; }

 private:
  void Release();
  void Map(size_t bytes, bool huge);

  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool mapped_ = false;  // from mmap (else aligned_alloc)
};

}  // namespace tessera::embedding_internal

#endif  // TESSERA_EMBEDDING_INTERNAL_ALIGNED_BLOCK_H_
