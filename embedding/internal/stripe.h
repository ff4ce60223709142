#ifndef TESSERA_EMBEDDING_INTERNAL_STRIPE_H_
#define TESSERA_EMBEDDING_INTERNAL_STRIPE_H_

// One of a table's 64 stripes: the rows whose map hash has its top 6 bits, an
// open-addressing id -> row map over them (IdMap) and the slab arena they live in.
//
// Rows never move: they are carved from slabs that live as long as the table, and a
// freed row is reused by a later one. The map grows by building a larger one.
//
// Concurrency. Writers (updates, inserts, erases, growth) hold `mu` exclusively and
// wrap every change of the map or of row memory in an odd value of the stripe's sequence
// number. Lookups take no lock: they read the sequence number, probe the map and copy
// rows, and keep what they read only when the number is the same even value afterwards
// (a seqlock), so a lookup never sees a half-applied update and never blocks a writer or
// another lookup; one that keeps losing that race falls back to `mu` in shared mode.
// Everything a lock-free reader may touch stays mapped while it reads: slabs are never
// freed, and a map replaced by a larger one is freed only while no lock-free reader is
// inside the table (its reader count).

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "embedding/internal/aligned_block.h"
#include "embedding/sharding.h"

namespace tessera::embedding_internal {

constexpr uint64_t kMapSalt = 0x5be0cd19137e2179ULL;
constexpr int kStripeShift = 58;  // 64 - log2(stripes)

// The hash that places an id in a stripe (top bits) and a map slot (low bits).
inline uint64_t MapHash(int64_t id) {
  return embedding::Mix64(static_cast<uint64_t>(id) ^ kMapSalt);
}

struct MapEntry {
  int64_t id;
  float* row;  // nullptr: empty slot
};

// One open-addressing array (power-of-two size, linear probing) of a stripe's map. Its
// capacity never changes: the stripe replaces a full one with a larger one.
class IdMap {
 public:
  // An empty map of `capacity` (a power of two) slots; null when out of memory.
  static std::unique_ptr<IdMap> Create(uint64_t capacity);

  uint64_t capacity() const { return mask_ + 1; }
  uint64_t mask() const { return mask_; }
  size_t bytes() const { return block_.bytes(); }
  MapEntry* entries() const { return entries_; }
  const MapEntry* HomeOf(uint64_t h) const { return entries_ + (h & mask_); }

  // The row of `id`, or null. Also safe without the stripe's lock (the lock-free
  // lookup), which validates what it read afterwards.
  float* Find(int64_t id, uint64_t h) const {
    for (uint64_t pos = h & mask_, probes = 0; probes <= mask_; pos = (pos + 1) & mask_, ++probes) {
      const MapEntry& e = entries_[pos];
      if (e.row == nullptr) return nullptr;
      if (e.id == id) return e.row;
    }
    return nullptr;
  }
  // The slot of `id`, or -1.
  int64_t FindSlot(int64_t id, uint64_t h) const;
  // Puts `id` -> `row` in the first empty slot of its probe run; requires one.
  void Place(int64_t id, uint64_t h, float* row);
  // Empties slot `pos` and shifts later entries of its probe run back, so every entry
  // stays reachable from its home slot without tombstones.
  void EraseSlot(uint64_t pos);

 private:
  IdMap(AlignedBlock block, uint64_t capacity)
      : block_(std::move(block)),
        entries_(static_cast<MapEntry*>(block_.data())),
        mask_(capacity - 1) {}

  AlignedBlock block_;
  MapEntry* entries_;
  uint64_t mask_;
};

class alignas(64) Stripe {
 public:
  Stripe() = default;
  Stripe(const Stripe&) = delete;
  Stripe& operator=(const Stripe&) = delete;

  // The table's count of lock-free readers (shared by its stripes). Set once, before use.
  void set_readers(const std::atomic<int32_t>* readers) { readers_ = readers; }

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
  // Bytes of rows and maps (replaced maps not yet freed included).
  int64_t Bytes() const;

  // The row of `id`, or null. Requires mu (shared or exclusive).
  float* Find(int64_t id, uint64_t h) const { return current_ ? current_->Find(id, h) : nullptr; }

  // Grows the map to hold `rows` rows at a load of at most 1/2 without growing again.
  // False when out of memory (the map is unchanged).
  bool Reserve(int64_t rows);

  // A new row of `id` (not present) in the map; its memory is the caller's to fill.
  // Null when out of memory (nothing changed).
  float* Insert(int64_t id, uint64_t h, int stride_floats);
  // Removes `id`'s row (slot `pos` of the current map) and keeps its memory for reuse.
  void EraseSlot(uint64_t pos);

  // The rows updated since the last ClearDirty, with their ids.
  std::vector<MapEntry> dirty;
  uint64_t sample_state = 0x9e3779b97f4a7c15ULL;  // eviction sampling

  // Frees replaced maps when no lock-free reader is inside the table.
  void FreeRetiredIfIdle();

 private:
  // Reserve(size + 1).
  bool ReserveOne() { return Reserve(size_ + 1); }
  float* AllocateRow(int stride_floats);

  // What lock-free readers touch sits in one cache line with the mutex.
  std::atomic<uint32_t> seq_{0};
  std::atomic<const IdMap*> published_{nullptr};  // == current_.get()
  const std::atomic<int32_t>* readers_ = nullptr;
  bool changing_ = false;
  std::unique_ptr<IdMap> current_;
  std::vector<std::unique_ptr<IdMap>> retired_;  // replaced maps readers may still probe
  int64_t size_ = 0;
  std::vector<AlignedBlock> slabs_;  // never move, never freed before the table
  float* bump_ = nullptr;
  int64_t bump_left_ = 0;
  int64_t next_slab_rows_ = 16;
  int64_t slab_bytes_ = 0;
  std::vector<float*> free_rows_;  // rows of erased entries, for reuse
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
