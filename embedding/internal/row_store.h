#ifndef TESSERA_EMBEDDING_INTERNAL_ROW_STORE_H_
#define TESSERA_EMBEDDING_INTERNAL_ROW_STORE_H_

// The rows of a dynamic table, addressed by a 32-bit row number and laid out at their
// payload's size:
//
//   weights  (rows, weight bytes)            the stored weights in the table's dtype,
//                                            unpadded: a lookup reads these alone
//   cold     (rows, state floats + 8 bytes)  the optimizer's state (fp32) and a PackedMeta
//   dirty    one bit a row                   changed since the last checkpoint
//
// except for wide rows with state (weights of 4 cache lines or more: dim >= 64 in fp32,
// >= 128 in half precision), whose weights and cold part sit together in one array, the
// row padded to whole lines when that adds at most an eighth: an update then reads and
// writes one run of lines instead of two in far-apart pages (the weights still start on
// a line).
//
// in chunks of 2^16 to 2^19 rows that are mapped as rows are first handed out and never
// move or go before the table (lock-free readers may read any row a map entry names). A
// chunk's pages become resident as rows are written; chunks after the first are advised
// for transparent huge pages (random rows over gigabytes miss the TLB otherwise) and hold
// as many rows as make each of their arrays whole huge pages (a tail of small pages
// would miss the TLB), so a table's memory runs ahead of its rows by at most one huge
// page per array.
//
// Row numbers are table-wide (at most 2^32 - 1 rows per table object, that is per shard
// of a table); stripes take them in blocks, their first ones small (a table's 64 stripes
// would otherwise hold 4,096 rows and touch a page each before their first rows are
// reused), then kBlockRows at a time, and keep the numbers of rows they erase for reuse.

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "embedding/internal/aligned_block.h"

namespace tessera::embedding_internal {

constexpr uint32_t kNoRow = 0xffffffffu;

// A row's bookkeeping in 8 bytes: its update count (saturating; Adam's t and the seed of
// half-precision rounding) and the low 32 bits of its last update step, which the table
// widens against the newest step it has seen (a row's last step is taken to lie within
// 2^32 steps of it).
struct PackedMeta {
  uint32_t updates = 0;
  uint32_t step = 0xffffffffu;  // low bits of -1: never updated
};

class RowStore {
  struct Chunk {
    char* weights = nullptr;
    char* cold = nullptr;
    uint64_t* dirty = nullptr;
  };

 public:
  static constexpr int kMinChunkShift = 16;
  static constexpr uint32_t kMaxChunks = uint32_t{1} << (32 - kMinChunkShift);
  static constexpr uint32_t kBlockRows = 64;  // divides every chunk's rows

  // Rows of `weight_bytes` stored weights and `state_floats` floats of optimizer state.
  RowStore(int weight_bytes, int state_floats);
  RowStore(const RowStore&) = delete;
  RowStore& operator=(const RowStore&) = delete;

  // False when the chunk directory could not be mapped.
  bool ok() const { return chunks_ != nullptr; }
  int weight_bytes() const { return weight_bytes_; }
  uint32_t chunk_rows() const { return uint32_t{1} << chunk_shift_; }
  int cold_bytes() const { return cold_bytes_; }
  // True when a row's weights and cold part sit together (see above).
  bool together() const { return together_; }
  // Bytes a row takes in the arrays (its dirty bit aside).
  int row_bytes() const { return together_ ? weight_stride_ : weight_stride_ + cold_stride_; }

  float* Weights(uint32_t r) const { return addresses().Weights(r); }
  float* State(uint32_t r) const {
    return reinterpret_cast<float*>(chunks_[r >> chunk_shift_].cold +
                                    static_cast<size_t>(r & chunk_mask_) * cold_stride_);
  }
  PackedMeta* Meta(uint32_t r) const {
    return reinterpret_cast<PackedMeta*>(reinterpret_cast<char*>(State(r)) + meta_at_);
  }
  // True for a row number handed out (any value a lock-free reader may have read torn is
  // checked with this before it is used).
  bool Valid(uint32_t r) const { return r < HandedOut(); }
  // Rows [0, HandedOut()) have memory (it only grows: a bound read once serves a batch).
  uint32_t HandedOut() const { return handed_out_.load(std::memory_order_acquire); }

  // Hands out `rows` (a power of two, at most kBlockRows) fresh row numbers from *first
  // on, their memory mapped; false when out of memory or of row numbers. Blocks smaller
  // than kBlockRows come out of a whole one shared by their takers (their dirty bits may
  // share a word: they are set and cleared atomically).
  bool TakeBlock(uint32_t* first, uint32_t rows = kBlockRows);

  // Where rows' weights are, as values that a hot loop keeps in registers (through the
  // store, the compiler reloads them after every store the loop makes: a row number
  // stored may alias its int fields).
  class Addresses {
   public:
    Addresses(const Chunk* chunks, int shift, uint32_t mask, int stride)
        : chunks_(chunks), shift_(shift), mask_(mask), stride_(stride) {}
    float* Weights(uint32_t r) const;

   private:
    const Chunk* chunks_;
    int shift_;
    uint32_t mask_;
    int stride_;
  };
  Addresses addresses() const {
    return Addresses(chunks_, chunk_shift_, chunk_mask_, weight_stride_);
  }

  // Dirty bits. Callers hold the row's stripe lock; rows of other stripes share the
  // words, so the bits change atomically.
  bool Dirty(uint32_t r) const {
    return (__atomic_load_n(DirtyWord(r), __ATOMIC_RELAXED) >> (r & 63)) & 1;
  }
  // The word of row `r`'s dirty bit, to prefetch with the row (an update tests it).
  const uint64_t* DirtyWordOf(uint32_t r) const { return DirtyWord(r); }
  // Sets the bit; true when it was clear. (A row updated again finds it set: a plain
  // load, no locked instruction.)
  bool SetDirty(uint32_t r) {
    const uint64_t bit = uint64_t{1} << (r & 63);
    uint64_t* word = DirtyWord(r);
    if (__atomic_load_n(word, __ATOMIC_RELAXED) & bit) return false;
    return (__atomic_fetch_or(word, bit, __ATOMIC_RELAXED) & bit) == 0;
  }
  // Clears the bit; true when it was set.
  bool ClearDirty(uint32_t r) {
    const uint64_t bit = uint64_t{1} << (r & 63);
    return (__atomic_fetch_and(DirtyWord(r), ~bit, __ATOMIC_RELAXED) & bit) != 0;
  }

  // Bytes of the rows handed out (weights, cold part and dirty bits): what the table's
  // rows take of resident memory, give or take a huge page per array.
  int64_t Bytes() const;

 private:
  uint64_t* DirtyWord(uint32_t r) const {
    return chunks_[r >> chunk_shift_].dirty + ((r & chunk_mask_) >> 6);
  }

  const int weight_bytes_;
  const int cold_bytes_;
  const int meta_at_;
  const bool together_;
  // Bytes from a row to the next in the weights and cold arrays (together: both the
  // padded row, the cold array starting weight_bytes_ into the weights').
  const int weight_stride_;
  const int cold_stride_;
  const int chunk_shift_;
  const uint32_t chunk_mask_;
  AlignedBlock directory_;  // kMaxChunks Chunk entries, resident as they are used
  Chunk* chunks_ = nullptr;
  std::atomic<uint32_t> handed_out_{0};  // rows [0, handed_out_) have memory
  absl::Mutex mu_;
  std::vector<AlignedBlock> blocks_ ABSL_GUARDED_BY(mu_);
  // The whole block that small blocks come out of: its next row and how many are left.
  uint32_t small_next_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t small_left_ ABSL_GUARDED_BY(mu_) = 0;
  // A whole block of kBlockRows rows from *first on (mapping a new chunk at its start).
  bool TakeWholeBlockLocked(uint32_t* first) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

inline float* RowStore::Addresses::Weights(uint32_t r) const {
  return reinterpret_cast<float*>(chunks_[r >> shift_].weights +
                                  static_cast<size_t>(r & mask_) * stride_);
}

}  // namespace tessera::embedding_internal

#endif  // TESSERA_EMBEDDING_INTERNAL_ROW_STORE_H_
