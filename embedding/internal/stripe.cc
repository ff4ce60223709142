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

std::unique_ptr<IdMap> IdMap::Create(uint64_t capacity) {
  const size_t bytes = capacity * sizeof(MapEntry);
  AlignedBlock block = bytes >= kMappedBytes ? AlignedBlock::Lazy(bytes, /*huge=*/bytes >= (2 << 20))
                                             : AlignedBlock(bytes, /*zeroed=*/false);
  if (block.empty()) return nullptr;
  std::memset(block.data(), 0xff, bytes);  // every slot empty (row kNoRow)
  return std::unique_ptr<IdMap>(new IdMap(std::move(block), capacity));
}

int64_t IdMap::FindSlot(uint64_t h) const {
  uint64_t pos = HomeSlot(h);
  for (uint64_t dist = 0; dist < capacity_; ++dist) {
    const MapEntry& e = entries_[pos];
    if (e.row == kNoRow || Distance(pos, e.hash) < dist) return -1;
    if (e.hash == h) return static_cast<int64_t>(pos);
    if (++pos == capacity_) pos = 0;
  }
  return -1;
}

void IdMap::Place(uint64_t h, uint32_t row) {
  MapEntry carried{h, row};
  uint64_t pos = HomeSlot(h);
  for (uint64_t dist = 0;; ++dist) {
    MapEntry& e = entries_[pos];
    if (e.row == kNoRow) {
      e = carried;
      return;
    }
    // Robin Hood: the entry nearer its home gives its slot up and moves on.
    if (const uint64_t d = Distance(pos, e.hash); d < dist) {
      const MapEntry displaced = e;
      e = carried;
      carried = displaced;
      dist = d;
    }
    if (++pos == capacity_) pos = 0;
  }
}

void IdMap::EraseSlot(uint64_t pos) {
  for (;;) {
    uint64_t next = pos + 1 == capacity_ ? 0 : pos + 1;
    const MapEntry& e = entries_[next];
    if (e.row == kNoRow || Distance(next, e.hash) == 0) break;
    entries_[pos] = e;
    pos = next;
  }
  entries_[pos] = MapEntry{0, kNoRow};
}

int64_t Stripe::Bytes() const {
  int64_t bytes = current_ ? static_cast<int64_t>(current_->bytes()) : 0;
  for (const auto& m : retired_) bytes += static_cast<int64_t>(m->bytes());
  return bytes;
}

bool Stripe::Reserve(int64_t rows) {
  const uint64_t cap = current_ ? current_->capacity() : 0;
  if (current_ && static_cast<uint64_t>(rows) <= current_->limit()) return true;
  uint64_t grown_cap = std::max(kMinCapacity, cap + cap / 8);
  const uint64_t need = static_cast<uint64_t>(static_cast<double>(rows) / IdMap::kMaxLoad) + 1;
  grown_cap = std::max(grown_cap, need);
  if (grown_cap > (uint64_t{1} << 32)) return false;
  std::unique_ptr<IdMap> grown = IdMap::Create(grown_cap);
  if (!grown) return false;
  if (current_) {
    // Slot order is nearly home order, so the new map fills nearly in order.
    const MapEntry* old = current_->entries();
    for (uint64_t pos = 0; pos < cap; ++pos) {
      if (old[pos].row != kNoRow) grown->Place(old[pos].hash, old[pos].row);
    }
    retired_.push_back(std::move(current_));
  }
  // A reader still probing the old map finds what the new one holds: it is unchanged.
  current_ = std::move(grown);
  published_.store(current_.get(), std::memory_order_seq_cst);
  return true;
}

uint32_t Stripe::AllocateRow() {
  if (!free_rows_.empty()) {
    const uint32_t row = free_rows_.back();
    free_rows_.pop_back();
    return row;
  }
  if (block_left_ == 0) {
    if (!rows_->TakeBlock(&block_next_)) return kNoRow;
    block_left_ = RowStore::kBlockRows;
  }
  --block_left_;
  return block_next_++;
}

uint32_t Stripe::Insert(uint64_t h) {
  if (!ReserveOne()) return kNoRow;
  const uint32_t row = AllocateRow();
  if (row == kNoRow) return kNoRow;
  BeginChange();
  current_->Place(h, row);
  ++size_;
  return row;
}

void Stripe::EraseSlot(uint64_t pos) {
  BeginChange();
  free_rows_.push_back(current_->entries()[pos].row);
  current_->EraseSlot(pos);
  --size_;
}

void Stripe::FreeRetiredIfIdle() {
  if (!retired_.empty() && readers_->load(std::memory_order_seq_cst) == 0) retired_.clear();
}

}  // namespace tessera::embedding_internal
