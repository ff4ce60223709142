#ifndef TESSERA_EMBEDDING_INTERNAL_STRIPE_H_
#define TESSERA_EMBEDDING_INTERNAL_STRIPE_H_

// One of a table's 64 stripes: the rows whose map hash has its top 6 bits, and an
// open-addressing map from their ids to their row numbers in the table's RowStore.
//
// The map (IdMap) stores each id's map hash, which names the id one to one (MapId
// inverts it), and a 32-bit row number: 12 bytes a slot, five slots a 64-byte bucket. It
// is a two-choice bucketed cuckoo table over any number of buckets, filled to at most its
// load limit and grown by a tenth when full (or a little earlier when an insert's walk
// finds no room). The limit depends on the row (IdMap::LoadFor): 0.94 for rows under 256
// bytes (a load of about 0.85 to 0.94, 13.6-15 bytes a row), 0.6 for wider ones (0.55 to
// 0.6, 22 bytes a row, under a tenth of the row). Finding an id reads one cache line, and
// a second for the ids that went to their second bucket: about 4% of them at 0.6, 19-34%
// at 0.85-0.94 (a dependent miss each on a table larger than the cache).
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
#include "embedding/internal/reader_epochs.h"
#include "embedding/internal/row_store.h"
#include "embedding/sharding.h"

namespace tessera::embedding_internal {

constexpr uint64_t kMapSalt = 0x5be0cd19137e2179ULL;
constexpr int kStripeShift = 58;  // 64 - log2(stripes)

// The hash that places an id in a stripe (top bits) and its map buckets (lower bits).
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

// A stripe's map: a bucketed cuckoo hash table. A bucket is one cache line of kSlots
// entries; an id lives in its first bucket or, when that was full, its second. Finding
// it reads one line, the first bucket (the only one a batch prefetches), and the second
// only when the first's overflow tag (a bit per hash of the entries that went to their
// second bucket) says it may be there: about one lookup in eight at the map's load.
// (An open-addressing probe at this load runs into a second line most of the time, and
// reading two lines an id, prefetched or not, slowed a gather on a large table by a
// quarter.) Inserting into two full buckets moves an entry on to its other bucket, and
// so on (a short walk, undone when it finds no room). Its capacity never changes: the
// stripe replaces a full one with a larger one.
class IdMap {
 public:
  static constexpr int kSlots = 5;          // 60 of a bucket's 64 bytes
  static constexpr double kMaxLoad = 0.94;  // the highest load limit (narrow rows)
  static constexpr double kWideLoad = 0.6;  // the limit for rows of kWideRowBytes or more
  static constexpr int kWideRowBytes = 256;
  struct alignas(64) Bucket {
    MapEntry slot[kSlots];
    // TagBit of every entry whose first bucket this is and that went to its second.
    uint32_t overflow;
  };
  static_assert(sizeof(Bucket) == 64);

  // The load limit of a map over rows of `row_bytes` bytes (RowStore::row_bytes): where
  // a row is wide, the map's bytes are a small part of it and fewer ids in their second
  // bucket make lookups faster.
  static double LoadFor(int row_bytes) { return row_bytes >= kWideRowBytes ? kWideLoad : kMaxLoad; }
  // The most map bytes a row of `row_bytes` bytes takes: a map grown by a tenth at its
  // limit (Stripe::Grow) runs down to a tenth under it.
  static double MostBytesPerRow(int row_bytes) {
    return sizeof(MapEntry) / (LoadFor(row_bytes) / 1.1);
  }

  // An empty map of at least `capacity` slots, filled to at most `max_load`; null when
  // out of memory.
  static std::unique_ptr<IdMap> Create(uint64_t capacity, double max_load = kMaxLoad);

  uint64_t buckets() const { return buckets_; }
  // Slots, numbered bucket * kSlots + i.
  uint64_t capacity() const { return buckets_ * kSlots; }
  // Entries the map takes before it must grow.
  uint64_t limit() const {
    return static_cast<uint64_t>(static_cast<double>(capacity()) * max_load_);
  }
  size_t bytes() const { return block_.bytes(); }
  const MapEntry& Slot(uint64_t pos) const { return buckets_of_[pos / kSlots].slot[pos % kSlots]; }

  // The probes of the map's buckets, over two values that a hot loop keeps in registers
  // (through the map, the compiler reloads them after every store the loop makes).
  class Probe {
   public:
    Probe(const Bucket* buckets, uint64_t count) : buckets_(buckets), count_(count) {}
    // The two buckets of hash `h` (the stripe's top bits aside; the same one twice when
    // the map has a single bucket).
    uint64_t FirstBucket(uint64_t h) const { return ((h & 0xffffffffu) * count_) >> 32; }
    uint64_t SecondBucket(uint64_t h) const {
      const uint64_t b = (((h >> 26) & 0xffffffffu) * count_) >> 32;
      return b != FirstBucket(h) ? b : (b + 1 == count_ ? 0 : b + 1);
    }
    void Prefetch(uint64_t h) const { __builtin_prefetch(buckets_ + FirstBucket(h), 0, 3); }
    // The row of the id of hash `h`, or kNoRow. Also safe without the stripe's lock (the
    // lock-free lookup), which validates what it read afterwards. Hashes are unique, so a
    // matching slot is the id's (an empty slot's row is kNoRow).
    uint32_t Find(uint64_t h) const {
      uint32_t row;
      return FindInFirst(h, &row) ? row : FindInSecond(h);
    }
    // Find in two steps, for a pipeline that prefetches the second bucket when the first
    // does not settle it: true with *row (kNoRow: absent) when the first bucket does.
    bool FindInFirst(uint64_t h, uint32_t* row) const {
      const Bucket& first = buckets_[FirstBucket(h)];
      *row = InBucket(first, h);
      return *row != kNoRow || (first.overflow & TagBit(h)) == 0;
    }
    void PrefetchSecond(uint64_t h) const { __builtin_prefetch(buckets_ + SecondBucket(h), 0, 3); }
    uint32_t FindInSecond(uint64_t h) const { return InBucket(buckets_[SecondBucket(h)], h); }

   private:
    const Bucket* buckets_;
    uint64_t count_;
  };
  Probe probe() const { return Probe(buckets_of_, buckets_); }

  // The map's own probes (Probe's), for code outside hot loops.
  uint64_t FirstBucket(uint64_t h) const { return probe().FirstBucket(h); }
  uint64_t SecondBucket(uint64_t h) const { return probe().SecondBucket(h); }
  static uint32_t TagBit(uint64_t h) { return uint32_t{1} << ((h >> 40) & 31); }
  void Prefetch(uint64_t h) const { probe().Prefetch(h); }
  uint32_t Find(uint64_t h) const { return probe().Find(h); }
  bool FindInFirst(uint64_t h, uint32_t* row) const { return probe().FindInFirst(h, row); }
  // The slot of hash `h`, or -1.
  int64_t FindSlot(uint64_t h) const;
  // Puts `h` -> `row` in (not present; the map has a free slot). False, with the map
  // unchanged, when a walk of moves found no room for it.
  bool Place(uint64_t h, uint32_t row);
  // Empties slot `pos`.
  void EraseSlot(uint64_t pos) {
    buckets_of_[pos / kSlots].slot[pos % kSlots] = MapEntry{0, kNoRow};
  }

 private:
  IdMap(AlignedBlock block, uint64_t buckets, double max_load)
      : block_(std::move(block)),
        buckets_of_(static_cast<Bucket*>(block_.data())),
        buckets_(buckets),
        max_load_(max_load) {}
  static uint32_t InBucket(const Bucket& b, uint64_t h) {
    uint32_t found = kNoRow;
    for (int i = 0; i < kSlots; ++i) found = b.slot[i].hash == h ? b.slot[i].row : found;
    return found;
  }
  // A free slot of bucket `b`, or -1.
  int FreeSlot(uint64_t b) const {
    for (int i = 0; i < kSlots; ++i) {
      if (buckets_of_[b].slot[i].row == kNoRow) return i;
    }
    return -1;
  }

  AlignedBlock block_;
  Bucket* buckets_of_;
  uint64_t buckets_;
  double max_load_;
  uint64_t kicks_ = 0x9e3779b97f4a7c15ULL;  // random bits: which entry a full bucket gives up
};

class alignas(64) Stripe {
 public:
  Stripe() = default;
  Stripe(const Stripe&) = delete;
  Stripe& operator=(const Stripe&) = delete;

  // The table's count of lock-free readers and its rows (shared by its stripes), whose
  // width sets the map's load limit (IdMap::LoadFor). Set once, before use.
  void Init(ReaderEpochs* readers, RowStore* rows) {
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

  // Frees the replaced maps no lock-free reader can still hold (ReaderEpochs). Inline: a
  // writer calls it on every release, and there is seldom a map to free.
  void FreeRetiredIfIdle() {
    if (!retired_.empty()) FreeRetired();
  }
  // Replaced maps not freed yet (for tests).
  size_t retired_maps() const { return retired_.size(); }

 private:
  // FreeRetiredIfIdle, with maps to free.
  void FreeRetired();
  // Reserve(size + 1).
  bool ReserveOne() { return Reserve(size_ + 1); }
  // Replaces the map by one that holds `rows` rows at its load limit, more when a walk
  // found no room, with every entry and `extra` (when not null). False when out of memory.
  bool Grow(uint64_t rows, const MapEntry* extra);
  uint32_t AllocateRow();

  // What lock-free readers touch sits in one cache line with the mutex, and so does what
  // every writer touches on its way out (changing_, retired_): a push that updates rows
  // which are there already reads no other line of the stripe.
  std::atomic<uint32_t> seq_{0};
  bool changing_ = false;
  std::atomic<const IdMap*> published_{nullptr};  // == current_.get()
  ReaderEpochs* readers_ = nullptr;
  std::unique_ptr<IdMap> current_;
  struct Retired {
    uint64_t epoch;  // when it was replaced (ReaderEpochs)
    std::unique_ptr<IdMap> map;
  };
  std::vector<Retired> retired_;  // replaced maps readers may still probe

 public:
  // Past the first line: only eviction uses it (embedding_table_eviction.cc).
  uint64_t sample_state = 0x9e3779b97f4a7c15ULL;  // eviction sampling

 private:
  int64_t size_ = 0;
  RowStore* rows_ = nullptr;
  uint32_t block_next_ = 0;  // rows taken from the store and not used yet
  uint32_t block_left_ = 0;
  // Rows of the next block taken: 2 first, doubling up to RowStore::kBlockRows, so that a
  // table's many stripes take few rows while they hold few.
  uint32_t next_block_rows_ = 2;
  std::vector<uint32_t> free_rows_;  // rows of erased entries, for reuse
};

// Counts a lock-free reader in `readers` for its lifetime.
class ReaderScope {
 public:
  explicit ReaderScope(ReaderEpochs& readers) : readers_(readers), slot_(readers.Enter()) {}
  ~ReaderScope() { readers_.Leave(slot_); }
  ReaderScope(const ReaderScope&) = delete;
  ReaderScope& operator=(const ReaderScope&) = delete;

 private:
  ReaderEpochs& readers_;
  const int slot_;
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
