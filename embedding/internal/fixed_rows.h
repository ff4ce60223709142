#ifndef TESSERA_EMBEDDING_INTERNAL_FIXED_ROWS_H_
#define TESSERA_EMBEDDING_INTERNAL_FIXED_ROWS_H_

// The storage of a fixed-vocabulary table (TableConfig.vocabulary_size): its part's rows in
// arrays addressed by id, no map and no stored ids.
//
//   weights  (rows, weight_floats)  the stored weights in the table's dtype, unpadded
//   state    (rows, state_floats)   the optimizer's state (fp32); none for SGD
//   counts   (rows) uint32          update counts, only where the math needs them (Adam's
//                                   bias correction, half-precision rounding bits)
//   live     one bit a row          the row was stored (updated or put); a row without
//                                   it reads its initial weights, computed on use. A
//                                   row not stored is zero bytes, so a lookup reads the
//                                   bit only for a row of zero bytes
//   dirty    one bit a row          changed since the last checkpoint
//
// The table's part holds the ids `index + count * i` of the vocabulary (count: the shards
// of every level together), row i of the arrays. Arrays are mapped lazily (aligned_block):
// memory is taken as rows are first written.
//
// Concurrency: row i belongs to the table's stripe (i / 64) % 64, so the 64 bits of one
// bitmap word share a stripe and its writer lock; writers change rows and bits inside the
// stripe's sequence-number window, and lock-free readers validate against it, as for
// dynamic tables (stripe.h).

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>

#include "embedding/internal/aligned_block.h"

namespace tessera::embedding_internal {

class FixedRows {
 public:
  // Null when the arrays cannot be mapped. `vocabulary` ids, of which this part holds
  // those congruent to `part_index` modulo `part_count`.
  static std::unique_ptr<FixedRows> Create(int64_t vocabulary, int64_t part_index,
                                           int64_t part_count, int weight_floats, int state_floats,
                                           bool counts);

  int64_t rows() const { return rows_; }
  int64_t vocabulary() const { return vocabulary_; }
  int64_t part_index() const { return part_index_; }
  int64_t part_count() const { return part_count_; }
  bool keeps_counts() const { return counts_ != nullptr; }
  // Bytes of the arrays at most (every row written).
  int64_t ReservedBytes() const { return reserved_bytes_; }

  // True when `id` is one of this part's ids.
  bool Holds(int64_t id) const {
    if (id < 0 || id >= vocabulary_) return false;
    return part_count_ == 1 || id - RowOf(id) * part_count_ == part_index_;
  }
  // id / part_count for an id of the vocabulary (below 2^40), without a division
  // instruction (tens of cycles, more than the row's copy): a multiply by the reciprocal
  // in double precision is off by at most one, which the remainder corrects.
  int64_t RowOf(int64_t id) const {
    if (part_count_ == 1) return id;
    int64_t q = static_cast<int64_t>(static_cast<double>(id) * reciprocal_);
    const int64_t r = id - q * part_count_;
    if (r < 0) {
      --q;
    } else if (r >= part_count_) {
      ++q;
    }
    return q;
  }
  // The bitmap word that says whether `row` is live (to prefetch).
  const uint64_t* LiveWordOf(int64_t row) const { return live_ + (row >> 6); }
  int64_t IdOf(int64_t row) const { return row * part_count_ + part_index_; }
  static int StripeOf(int64_t row) { return static_cast<int>((row >> 6) & 63); }

  float* Weights(int64_t row) const { return weights_ + row * weight_floats_; }
  // True when the stored weights of `row` are all zero bytes, as a row's never stored are.
  bool ZeroBytes(int64_t row) const {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(Weights(row));
    uint32_t any = 0;
    for (int j = 0; j < weight_floats_; ++j) any |= w[j];
    return any == 0;
  }
  // Zeroes the stored weights and state of `row`.
  void ZeroRow(int64_t row) const {
    std::memset(Weights(row), 0, sizeof(float) * weight_floats_);
    if (state_floats_ > 0) std::memset(State(row), 0, sizeof(float) * state_floats_);
  }
  float* State(int64_t row) const { return state_ + row * state_floats_; }
  uint32_t Count(int64_t row) const { return counts_ != nullptr ? counts_[row] : 0; }
  void SetCount(int64_t row, uint32_t n) const {
    if (counts_ != nullptr) counts_[row] = n;
  }

  // Lock-free readers may call Live; the setters need the row's stripe lock.
  bool Live(int64_t row) const { return Bit(live_, row); }
  void SetLive(int64_t row, bool on) { SetBit(live_, row, on); }
  // The dirty bit of `row`, and the count of dirty rows that goes with it.
  void MarkDirty(int64_t row) {
    if (Bit(dirty_, row)) return;
    SetBit(dirty_, row, true);
    dirty_rows_.fetch_add(1, std::memory_order_relaxed);
  }
  void MarkClean(int64_t row) {
    if (!Bit(dirty_, row)) return;
    SetBit(dirty_, row, false);
    dirty_rows_.fetch_sub(1, std::memory_order_relaxed);
  }
  // Clears the dirty bits of word `w` (its stripe's lock held).
  void ClearDirtyWord(int64_t w) {
    const int64_t cleared = __builtin_popcountll(DirtyWord(w));
    if (cleared == 0) return;
    __atomic_store_n(dirty_ + w, 0, __ATOMIC_RELAXED);
    dirty_rows_.fetch_sub(cleared, std::memory_order_relaxed);
  }
  int64_t dirty_rows() const { return dirty_rows_.load(std::memory_order_relaxed); }
  int64_t words() const { return (rows_ + 63) / 64; }

  // Writers of rows count themselves for their whole call, so that a lookup that
  // overlapped no writer (the common case) checks nothing per row: QuietBegin before its
  // reads (kNotQuiet while a writer is at work), QuietEnd after them.
  static constexpr uint64_t kNotQuiet = ~uint64_t{0};
  uint64_t QuietBegin() const {
    const uint64_t writes = writes_.load(std::memory_order_seq_cst);
    return writers_.load(std::memory_order_seq_cst) == 0 ? writes : kNotQuiet;
  }
  bool QuietEnd(uint64_t begin) const {
    std::atomic_thread_fence(std::memory_order_acquire);
    // A row store this lookup saw makes its writer's count visible here (the writer's
    // release fence after counting itself); a writer seen gone had counted its write.
    return begin != kNotQuiet && writers_.load(std::memory_order_acquire) == 0 &&
           writes_.load(std::memory_order_relaxed) == begin;
  }
  class WriteScope {
   public:
    explicit WriteScope(const FixedRows& f) : f_(f) {
      f_.writers_.fetch_add(1, std::memory_order_seq_cst);
      std::atomic_thread_fence(std::memory_order_release);  // before any row store
    }
    ~WriteScope() {
      f_.writes_.fetch_add(1, std::memory_order_release);
      f_.writers_.fetch_sub(1, std::memory_order_release);
    }
    WriteScope(const WriteScope&) = delete;
    WriteScope& operator=(const WriteScope&) = delete;

   private:
    const FixedRows& f_;
  };
  uint64_t LiveWord(int64_t w) const { return __atomic_load_n(live_ + w, __ATOMIC_RELAXED); }
  uint64_t DirtyWord(int64_t w) const { return __atomic_load_n(dirty_ + w, __ATOMIC_RELAXED); }

 private:
  FixedRows() = default;
  static bool Bit(const uint64_t* words, int64_t row) {
    return (__atomic_load_n(words + (row >> 6), __ATOMIC_RELAXED) >> (row & 63)) & 1;
  }
  static void SetBit(uint64_t* words, int64_t row, bool on) {
    const uint64_t w = __atomic_load_n(words + (row >> 6), __ATOMIC_RELAXED);
    const uint64_t bit = uint64_t{1} << (row & 63);
    __atomic_store_n(words + (row >> 6), on ? (w | bit) : (w & ~bit), __ATOMIC_RELAXED);
  }

  int64_t rows_ = 0, vocabulary_ = 0, part_index_ = 0, part_count_ = 1;
  double reciprocal_ = 1.0;                  // 1 / part_count_
  mutable std::atomic<int32_t> writers_{0};  // writers at work (WriteScope)
  mutable std::atomic<uint64_t> writes_{0};  // writers done
  std::atomic<int64_t> dirty_rows_{0};       // dirty bits set
  int weight_floats_ = 0, state_floats_ = 0;
  int64_t reserved_bytes_ = 0;
  AlignedBlock weights_block_, state_block_, counts_block_, live_block_, dirty_block_;
  float* weights_ = nullptr;
  float* state_ = nullptr;
  uint32_t* counts_ = nullptr;
  uint64_t* live_ = nullptr;
  uint64_t* dirty_ = nullptr;
};

}  // namespace tessera::embedding_internal

#endif  // TESSERA_EMBEDDING_INTERNAL_FIXED_ROWS_H_
