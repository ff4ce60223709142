#ifndef TESSERA_EMBEDDING_INTERNAL_STRIPE_H_
#define TESSERA_EMBEDDING_INTERNAL_STRIPE_H_

// One of a table's 64 stripes: the rows whose map hash has its top 6 bits, and an
// open-addressing map from their ids to their row numbers in the table's RowStore.
//
// The map (IdMap) stores each id's map hash, which names the id one to one (MapId
// inverts it), and a 32-bit row number: 12 bytes a slot. It is a Robin Hood table over
// any capacity (a slot's home is the hash scaled to the capacity), filled to at most
// 0.9 and grown by an eighth when full, so it runs at a load of 0.8 to 0.9. Finding an
// id stops at the first slot whose entry sits nearer its home than the id would.
//
// Concurrency. Writers (updates, inserts, erases, growth) hold `mu` exclusively and
// wrap every change of the map or of row memory in an odd value of the stripe's sequence
// number. Lookups take no lock: they read the sequence number, probe the map and copy
// rows, and keep what they read only when the number is the same even value afterwards
// (a seqlock), so a lookup never sees a half-applied update and never blocks a writer or
// another lookup; one that keeps losing that race falls back to `mu` in shared mode.
// Everything a lock-free reader may touch stays mapped while it reads: rows are never
// freed, and a map replaced by a larger one is freed only while no lock-free reader is
// inside the table (its reader count).

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "embedding/internal/aligned_block.h"
#include "embedding/internal/row_store.h"
#include "embedding/sharding.h"

namespace tessera::embedding_internal {

constexpr uint64_t kMapSalt = 0x5be0cd19137e2179ULL;
constexpr int kStripeShift = 58;  // 64 - log2(stripes)

// The hash that places an id in a stripe (top bits) and a map slot (low 32 bits).
inline uint64_t MapHash(int64_t id) {
  return embedding::Mix64(static_cast<uint64_t>(id) ^ kMapSalt);
}
// The id whose MapHash is `h` (Mix64 is one to one).
int64_t MapId(uint64_t h);

struct __attribute__((packed)) MapEntry {
  uint64_t hash;  // MapHash of the id
  uint32_t row;   // kNoRow: empty slot
};
static_assert(sizeof(MapEntry) == 12);

// One open-addressing array of a stripe's map. Its capacity never changes: the stripe
// replaces a full one with a larger one.
class IdMap {
 public:
  static constexpr double kMaxLoad = 0.9;

  // An empty map of `capacity` (at most 2^32) slots; null when out of memory.
  static std::unique_ptr<IdMap> Create(uint64_t capacity);

  uint64_t capacity() const { return capacity_; }
  // Entries the map takes before it must grow.
  uint64_t limit() const { return static_cast<uint64_t>(static_cast<double>(capacity_) * kMaxLoad); }
  size_t bytes() const { return block_.bytes(); }
  const MapEntry* entries() const { return entries_; }
  uint64_t HomeSlot(uint64_t h) const { return ((h & 0xffffffffu) * capacity_) >> 32; }
  const MapEntry* HomeOf(uint64_t h) const { return entries_ + HomeSlot(h); }

  // The row of the id of hash `h`, or kNoRow. Also safe without the stripe's lock (the
  // lock-free lookup), which validates what it read afterwards.
  uint32_t Find(uint64_t h) const {
    uint64_t pos = HomeSlot(h);
    for (uint64_t dist = 0; dist < capacity_; ++dist) {
      const MapEntry& e = entries_[pos];
      if (e.row == kNoRow) return kNoRow;
      if (e.hash == h) return e.row;
      if (Distance(pos, e.hash) < dist) return kNoRow;  // h would sit here or before
      if (++pos == capacity_) pos = 0;
    }
    return kNoRow;
  }
  // The slot of hash `h`, or -1.
  int64_t FindSlot(uint64_t h) const;
  // Puts `h` -> `row` in (not present; the map has a free slot), moving richer entries on.
  void Place(uint64_t h, uint32_t row);
  // Empties slot `pos` and shifts the entries after it back towards their homes.
  void EraseSlot(uint64_t pos);

 private:
  IdMap(AlignedBlock block, uint64_t capacity)
      : block_(std::move(block)),
        entries_(static_cast<MapEntry*>(block_.data())),
        capacity_(capacity) {}
  // How far slot `pos` lies past the home of `h`.
  uint64_t Distance(uint64_t pos, uint64_t h) const {
    const uint64_t home = HomeSlot(h);
    return pos >= home ? pos - home : pos + capacity_ - home;
  }

  AlignedBlock block_;
  MapEntry* entries_;
  uint64_t capacity_;
};

class alignas(64) Stripe {
 public:
  Stripe() = default;
  Stripe(const Stripe&) = delete;
  Stripe& operator=(const Stripe&) = delete;

  // The table's count of lock-free readers and its rows (shared by its stripes). Set
  // once, before use.
  void Init(const std::atomic<int32_t>* readers, RowStore* rows) {
    readers_ = readers;
    rows_ = rows;
  }

  // --- Lock-free readers (counted in the table's readers while they read) ---
  // The map to probe (null before the first row).
  const IdMap* map() const { return published_.load(std::memory_order_seq_cst); }
  // The sequence number before a read; odd while a writer changes the stripe.
  uint32_t ReadBegin() const { return seq_.load(std::memory_order_acquire); }
  // True when nothing changed since ReadBegin returned `begin` (even).
  bool ReadValid(uint32_t begin) const {
    std::atomic_thread_fence(std::memory_order_acquire);
    return seq_.load(std::memory_order_relaxed) == begin;
  }

  // --- Writers (hold mu) ---
  mutable absl::Mutex mu;

  // Marks the stripe as changing (idempotent until EndChange).
  void BeginChange() {
    if (changing_) return;
    seq_.store(seq_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    changing_ = true;
  }
  // Ends the change: readers may use the stripe again.
  void EndChange() {
    if (!changing_) return;
    seq_.store(seq_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    changing_ = false;
  }

  int64_t size() const { return size_; }
  const IdMap* current() const { return current_.get(); }
  // Bytes of the maps (replaced ones not yet freed included); the rows are the store's.
  int64_t Bytes() const;

  // The row of the id of hash `h`, or kNoRow. Requires mu (shared or exclusive).
  uint32_t Find(uint64_t h) const { return current_ ? current_->Find(h) : kNoRow; }

  // Grows the map to hold `rows` rows without growing again. False when out of memory
  // (the map is unchanged).
  bool Reserve(int64_t rows);

  // A new row for the id of hash `h` (not present) in the map; its memory is the
  // caller's to fill. kNoRow when out of memory (nothing changed).
  uint32_t Insert(uint64_t h);
  // Removes the entry in slot `pos` of the current map and keeps its row for reuse.
  void EraseSlot(uint64_t pos);

  uint64_t sample_state = 0x9e3779b97f4a7c15ULL;  // eviction sampling

  // Frees replaced maps when no lock-free reader is inside the table.
  void FreeRetiredIfIdle();

 private:
  // Reserve(size + 1).
  bool ReserveOne() { return Reserve(size_ + 1); }
  uint32_t AllocateRow();

  // What lock-free readers touch sits in one cache line with the mutex.
  std::atomic<uint32_t> seq_{0};
  std::atomic<const IdMap*> published_{nullptr};  // == current_.get()
  const std::atomic<int32_t>* readers_ = nullptr;
  bool changing_ = false;
  std::unique_ptr<IdMap> current_;
  std::vector<std::unique_ptr<IdMap>> retired_;  // replaced maps readers may still probe
  int64_t size_ = 0;
  RowStore* rows_ = nullptr;
  uint32_t block_next_ = 0;  // rows taken from the store and not used yet
  uint32_t block_left_ = 0;
  std::vector<uint32_t> free_rows_;  // rows of erased entries, for reuse
};

// Counts a lock-free reader in `readers` for its lifetime.
class ReaderScope {
 public:
  explicit ReaderScope(std::atomic<int32_t>& readers) : readers_(readers) {
    readers_.fetch_add(1, std::memory_order_seq_cst);
  }
  ~ReaderScope() { readers_.fetch_sub(1, std::memory_order_release); }
  ReaderScope(const ReaderScope&) = delete;
  ReaderScope& operator=(const ReaderScope&) = delete;

 private:
  std::atomic<int32_t>& readers_;
};

inline absl::Mutex& StripeMutex(Stripe& stripe) ABSL_LOCK_RETURNED(stripe.mu) {
  return stripe.mu;
}

// Holds a stripe's writer lock; ends any change and frees idle replaced maps on release.
class ABSL_SCOPED_LOCKABLE StripeWriter {
 public:
  explicit StripeWriter(Stripe& stripe) ABSL_EXCLUSIVE_LOCK_FUNCTION(stripe.mu)
      : stripe_(stripe) {
    stripe_.mu.Lock();
  }
  ~StripeWriter() ABSL_UNLOCK_FUNCTION() { Release(stripe_); }
  StripeWriter(const StripeWriter&) = delete;
  StripeWriter& operator=(const StripeWriter&) = delete;

  // What the destructor does, for a stripe locked with TryLock.
  static void Release(Stripe& stripe) ABSL_UNLOCK_FUNCTION(stripe.mu) {
    stripe.EndChange();
    stripe.FreeRetiredIfIdle();
    stripe.mu.Unlock();
  }

 private:
  Stripe& stripe_;
};

}  // namespace tessera::embedding_internal

#endif  // TESSERA_EMBEDDING_INTERNAL_STRIPE_H_
