#include "embedding/internal/row_store.h"

#include <algorithm>

namespace tessera::embedding_internal {
namespace {

// The fewest rows (a power of two, at least 2^16) that make `stride` bytes a row whole
// 2 MiB pages: 2^21 over the stride's largest power-of-two factor.
int ChunkShift(int stride) {
  int twos = 0;
  while (stride > 0 && twos < 21 && (stride >> twos) % 2 == 0) ++twos;
  return std::max(RowStore::kMinChunkShift, 21 - twos);
}

constexpr int kLine = 64;

int WholeLines(int bytes) { return (bytes + kLine - 1) / kLine * kLine; }

// Weights and cold part together: wide weights with state, padded by at most an eighth.
bool Together(int weight_bytes, int state_floats) {
  const int row = weight_bytes + state_floats * 4 + static_cast<int>(sizeof(PackedMeta));
  return weight_bytes >= 4 * kLine && weight_bytes % kLine == 0 && state_floats > 0 &&
         (WholeLines(row) - row) * 8 <= row;
}

}  // namespace

RowStore::RowStore(int weight_bytes, int state_floats)
    : weight_bytes_(weight_bytes),
      // The meta is 4-byte aligned after the state's floats.
      cold_bytes_(state_floats * 4 + static_cast<int>(sizeof(PackedMeta))),
      meta_at_(state_floats * 4),
      together_(Together(weight_bytes, state_floats)),
      weight_stride_(together_ ? WholeLines(weight_bytes_ + cold_bytes_) : weight_bytes_),
      cold_stride_(together_ ? weight_stride_ : cold_bytes_),
      chunk_shift_(std::max(ChunkShift(weight_stride_), ChunkShift(cold_stride_))),
      chunk_mask_((uint32_t{1} << chunk_shift_) - 1),
      directory_(AlignedBlock::Lazy(sizeof(Chunk) * kMaxChunks, /*huge=*/false)) {
  static_assert(sizeof(PackedMeta) == 8);
  if (!directory_.empty()) chunks_ = static_cast<Chunk*>(directory_.data());
}

bool RowStore::TakeBlock(uint32_t* first, uint32_t rows) {
  absl::MutexLock lock(&mu_);
  if (rows >= kBlockRows) return TakeWholeBlockLocked(first);
  if (small_left_ < rows) {
    // What is left of the last shared block (fewer rows than asked) is never used.
    if (!TakeWholeBlockLocked(&small_next_)) return false;
    small_left_ = kBlockRows;
  }
  *first = small_next_;
  small_next_ += rows;
  small_left_ -= rows;
  return true;
}

bool RowStore::TakeWholeBlockLocked(uint32_t* first) {
  const uint32_t next = handed_out_.load(std::memory_order_relaxed);
  if (next >= kNoRow - kBlockRows) return false;  // kNoRow stays free
  const uint32_t c = next >> chunk_shift_;
  if ((next & chunk_mask_) == 0) {
    const size_t rows = chunk_rows();
    // The first chunk stays on small pages, so a small table takes little memory; later
    // ones take huge pages where they fill them.
    const bool huge = c > 0;
    AlignedBlock weights = AlignedBlock::Lazy(rows * weight_stride_, huge);
    AlignedBlock cold = together_ ? AlignedBlock() : AlignedBlock::Lazy(rows * cold_stride_, huge);
    AlignedBlock dirty = AlignedBlock::Lazy(rows / 8, /*huge=*/false);
    if ((weight_stride_ > 0 && weights.empty()) || (!together_ && cold.empty()) || dirty.empty()) {
      return false;
    }
    Chunk& chunk = chunks_[c];
    chunk.weights = static_cast<char*>(weights.data());
    chunk.cold = together_ ? chunk.weights + weight_bytes_ : static_cast<char*>(cold.data());
    chunk.dirty = static_cast<uint64_t*>(dirty.data());
    blocks_.push_back(std::move(weights));
    blocks_.push_back(std::move(cold));
    blocks_.push_back(std::move(dirty));
  }
  *first = next;
  handed_out_.store(next + kBlockRows, std::memory_order_release);
  return true;
}

int64_t RowStore::Bytes() const {
  const int64_t rows = handed_out_.load(std::memory_order_relaxed);
  return rows * row_bytes() + rows / 8;
}

}  // namespace tessera::embedding_internal
