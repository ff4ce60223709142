#include "embedding/internal/aligned_block.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace tessera::embedding_internal {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

AlignedBlock::AlignedBlock(size_t bytes, bool zeroed) {
  if (bytes == 0) return;
  if (bytes < kHugePage) {
    bytes_ = RoundUp(bytes, 64);
    data_ = std::aligned_alloc(64, bytes_);
    if (data_ == nullptr) {
      bytes_ = 0;
      return;
    }
    if (zeroed) std::memset(data_, 0, bytes_);
    return;
  }
  Map(bytes, /*huge=*/true);
}

AlignedBlock AlignedBlock::Lazy(size_t bytes, bool huge) {
  AlignedBlock block;
  if (bytes > 0) block.Map(bytes, huge);
  return block;
}

void AlignedBlock::Map(size_t bytes, bool huge) {
  if (!huge) {
    const size_t want = RoundUp(bytes, 4096);
    void* raw = mmap(nullptr, want, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) return;
    data_ = raw;
    bytes_ = want;
    mapped_ = true;
    return;
  }
  // Map one huge page more than needed and trim both ends: 2 MiB aligned, whole pages.
  // Only the whole huge pages are advised: the tail's small pages become resident one by
  // one (a huge page there would take 2 MiB for what may be a few kilobytes).
  const size_t want = RoundUp(bytes, 4096);
  void* raw = mmap(nullptr, want + kHugePage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(begin, kHugePage);
  if (aligned > begin) munmap(raw, aligned - begin);
  const size_t tail = begin + want + kHugePage - (aligned + want);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + want), tail);
  data_ = reinterpret_cast<void*>(aligned);
  bytes_ = want;
  mapped_ = true;
  if (const size_t huge_bytes = want / kHugePage * kHugePage; huge_bytes > 0) {
    madvise(data_, huge_bytes, MADV_HUGEPAGE);
  }
}

AlignedBlock::~AlignedBlock() { Release(); }

AlignedBlock::AlignedBlock(AlignedBlock&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      mapped_(std::exchange(other.mapped_, false)) {}

AlignedBlock& AlignedBlock::operator=(AlignedBlock&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    mapped_ = std::exchange(other.mapped_, false);
  }
  return *this;
}

void AlignedBlock::Release() {
  if (data_ == nullptr) return;
  if (mapped_) {
    munmap(data_, bytes_);
  } else {
    std::free(data_);
  }
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace tessera::embedding_internal
