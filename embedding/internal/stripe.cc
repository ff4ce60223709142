#include "embedding/internal/stripe.h"

#include <algorithm>
#include <cstring>

namespace tessera::embedding_internal {
namespace {

// The inverse of an odd multiplier modulo 2^64 (Newton's iteration doubles the correct
// bits each round).
constexpr uint64_t InverseOf(uint64_t c) {
  uint64_t x = c;
  for (int i = 0; i < 6; ++i) x *= 2 - c * x;
  return x;
}

// The inverse of x ^= x >> s.
constexpr uint64_t UnXorShift(uint64_t y, int s) {
  uint64_t x = y;
  for (int k = s; k < 64; k += s) x = y ^ (x >> s);
  return x;
}

constexpr uint64_t UnMix(uint64_t x) {
  x = UnXorShift(x, 31);
  x *= InverseOf(0x94d049bb133111ebULL);
  x = UnXorShift(x, 27);
  x *= InverseOf(0xbf58476d1ce4e5b9ULL);
  return UnXorShift(x, 30);
}

static_assert(UnMix(embedding::Mix64(0x0123456789abcdefULL)) == 0x0123456789abcdefULL);
static_assert(UnMix(embedding::Mix64(~uint64_t{0})) == ~uint64_t{0});

constexpr uint64_t kMinCapacity = 16;
// Maps this large are mapped from the kernel (and given back when replaced): many
// replaced ones in the heap would stay resident.
constexpr size_t kMappedBytes = 16 << 10;

}  // namespace

int64_t MapId(uint64_t h) { return static_cast<int64_t>(UnMix(h) ^ kMapSalt); }

std::unique_ptr<IdMap> IdMap::Create(uint64_t capacity, double max_load) {
  const uint64_t buckets = std::max<uint64_t>(2, (capacity + kSlots - 1) / kSlots);
  if (buckets > (uint64_t{1} << 32)) return nullptr;
  const size_t bytes = buckets * sizeof(Bucket);
  AlignedBlock block = bytes >= kMappedBytes
                           ? AlignedBlock::Lazy(bytes, /*huge=*/bytes >= (2 << 20))
                           : AlignedBlock(bytes, /*zeroed=*/false);
  if (block.empty()) return nullptr;
  std::memset(block.data(), 0xff, bytes);  // every slot empty (row kNoRow)
  auto map = std::unique_ptr<IdMap>(new IdMap(std::move(block), buckets, max_load));
  for (uint64_t b = 0; b < buckets; ++b) map->buckets_of_[b].overflow = 0;
  return map;
}

int64_t IdMap::FindSlot(uint64_t h) const {
  auto slot_in = [&](uint64_t b) -> int64_t {
    for (int i = 0; i < kSlots; ++i) {
      const MapEntry& e = buckets_of_[b].slot[i];
      if (e.row != kNoRow && e.hash == h) return static_cast<int64_t>(b * kSlots + i);
    }
    return -1;
  };
  const uint64_t first = FirstBucket(h);
  if (const int64_t pos = slot_in(first); pos >= 0) return pos;
  return (buckets_of_[first].overflow & TagBit(h)) != 0 ? slot_in(SecondBucket(h)) : -1;
}

bool IdMap::Place(uint64_t h, uint32_t row) {
  constexpr int kMaxKicks = 128;
  constexpr uint64_t kNone = ~uint64_t{0};
  struct Step {
    uint64_t bucket;
    int slot;
  };
  Step path[kMaxKicks];
  MapEntry carried{h, row};
  uint64_t from = kNone;  // the bucket the carried entry was moved out of
  for (int kick = 0; kick < kMaxKicks; ++kick) {
    const uint64_t first = FirstBucket(carried.hash);
    const uint64_t second = SecondBucket(carried.hash);
    for (const uint64_t b : {first, second}) {
      if (b == from) continue;
      if (const int i = FreeSlot(b); i >= 0) {
        buckets_of_[b].slot[i] = carried;
        if (b == second) buckets_of_[first].overflow |= TagBit(carried.hash);
        return true;
      }
    }
    // Both full: the carried entry takes a slot, picked at random, of the bucket it did
    // not come from, and the entry there moves on.
    const uint64_t b = first != from ? first : second;
    kicks_ ^= kicks_ << 13;
    kicks_ ^= kicks_ >> 7;
    kicks_ ^= kicks_ << 17;
    const int victim = static_cast<int>((kicks_ >> 32) % kSlots);
    if (b == second) buckets_of_[first].overflow |= TagBit(carried.hash);
    path[kick] = Step{b, victim};
    std::swap(carried, buckets_of_[b].slot[victim]);
    from = b;
  }
  // No room on this walk: undo it, so the map holds what it held (overflow tags set on
  // the way stay: a tag only sends a lookup to a second bucket in vain).
  for (int kick = kMaxKicks - 1; kick >= 0; --kick) {
    std::swap(carried, buckets_of_[path[kick].bucket].slot[path[kick].slot]);
  }
  return false;
}

int64_t Stripe::Bytes() const {
  int64_t bytes = current_ ? static_cast<int64_t>(current_->bytes()) : 0;
  for (const Retired& r : retired_) bytes += static_cast<int64_t>(r.map->bytes());
  return bytes;
}

bool Stripe::Grow(uint64_t rows, const MapEntry* extra) {
  const uint64_t cap = current_ ? current_->capacity() : 0;
  const double max_load = IdMap::LoadFor(rows_->row_bytes());
  uint64_t want =
      std::max<uint64_t>({kMinCapacity, cap + cap / 10,
                          static_cast<uint64_t>(static_cast<double>(rows) / max_load) + 1});
  for (int attempt = 0; attempt < 8; ++attempt, want += want / 10) {
    std::unique_ptr<IdMap> grown = IdMap::Create(want, max_load);
    if (!grown) return false;
    bool placed = true;
    for (uint64_t pos = 0; placed && current_ && pos < cap; ++pos) {
      const MapEntry& e = current_->Slot(pos);
      if (e.row != kNoRow) placed = grown->Place(e.hash, e.row);
    }
    if (placed && extra != nullptr) placed = grown->Place(extra->hash, extra->row);
    if (!placed) continue;  // a crowded corner: a larger map
    // A reader still probing the old map finds what the new one holds: it is unchanged.
    std::unique_ptr<IdMap> old = std::move(current_);
    current_ = std::move(grown);
    published_.store(current_.get(), std::memory_order_seq_cst);
    // Tagged after the new map is published: a reader of a later epoch cannot see the old.
    if (old) retired_.push_back(Retired{readers_->current(), std::move(old)});
    return true;
  }
  return false;
}

bool Stripe::Reserve(int64_t rows) {
  if (current_ && static_cast<uint64_t>(rows) <= current_->limit()) return true;
  return Grow(static_cast<uint64_t>(rows), nullptr);
}

uint32_t Stripe::AllocateRow() {
  if (!free_rows_.empty()) {
    const uint32_t row = free_rows_.back();
    free_rows_.pop_back();
    return row;
  }
  if (block_left_ == 0) {
    if (!rows_->TakeBlock(&block_next_, next_block_rows_)) return kNoRow;
    block_left_ = next_block_rows_;
    next_block_rows_ = std::min(next_block_rows_ * 2, RowStore::kBlockRows);
  }
  --block_left_;
  return block_next_++;
}

uint32_t Stripe::Insert(uint64_t h) {
  if (!ReserveOne()) return kNoRow;
  const uint32_t row = AllocateRow();
  if (row == kNoRow) return kNoRow;
  BeginChange();
  const MapEntry entry{h, row};
  // A walk that finds no room leaves the map as it was: a larger one takes the entry.
  if (!current_->Place(h, row) && !Grow(static_cast<uint64_t>(size_) + 1, &entry)) {
    free_rows_.push_back(row);
    return kNoRow;
  }
  ++size_;
  return row;
}

void Stripe::EraseSlot(uint64_t pos) {
  BeginChange();
  free_rows_.push_back(current_->Slot(pos).row);
  current_->EraseSlot(pos);
  --size_;
}

void Stripe::FreeRetired() {
  // Twice: a map replaced in the current epoch is freed once the epoch has moved on, which
  // the first call does when no reader of the previous epoch is left (with no reader at
  // all, both calls succeed and every replaced map goes at once).
  for (int round = 0; round < 2 && !retired_.empty(); ++round) {
    const uint64_t oldest = readers_->Oldest();
    // Tags only grow along the vector: the maps to free are a prefix.
    size_t freed = 0;
    while (freed < retired_.size() && retired_[freed].epoch < oldest) ++freed;
    retired_.erase(retired_.begin(), retired_.begin() + static_cast<std::ptrdiff_t>(freed));
  }
}

}  // namespace tessera::embedding_internal
