#include "embedding/internal/stripe.h"

namespace tessera::embedding_internal {
namespace {

constexpr size_t kMaxSlabBytes = size_t{4} << 20;

}  // namespace

std::unique_ptr<IdMap> IdMap::Create(uint64_t capacity) {
  AlignedBlock block(capacity * sizeof(MapEntry));
  if (block.empty()) return nullptr;
  return std::unique_ptr<IdMap>(new IdMap(std::move(block), capacity));
}

int64_t IdMap::FindSlot(int64_t id, uint64_t h) const {
  for (uint64_t pos = h & mask_;; pos = (pos + 1) & mask_) {
    const MapEntry& e = entries_[pos];
    if (e.row == nullptr) return -1;
    if (e.id == id) return static_cast<int64_t>(pos);
  }
}

void IdMap::Place(int64_t id, uint64_t h, float* row) {
  uint64_t pos = h & mask_;
  while (entries_[pos].row != nullptr) pos = (pos + 1) & mask_;
  entries_[pos] = MapEntry{id, row};
}

void IdMap::EraseSlot(uint64_t pos) {
  entries_[pos] = MapEntry{0, nullptr};
  uint64_t hole = pos;
  for (uint64_t j = (pos + 1) & mask_; entries_[j].row != nullptr; j = (j + 1) & mask_) {
    const uint64_t home = MapHash(entries_[j].id) & mask_;
    // Entry j may fill the hole unless its home lies cyclically in (hole, j].
    const bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (!stays) {
      entries_[hole] = entries_[j];
      entries_[j] = MapEntry{0, nullptr};
      hole = j;
    }
  }
}

int64_t Stripe::Bytes() const {
  int64_t bytes = slab_bytes_ + (current_ ? static_cast<int64_t>(current_->bytes()) : 0);
  for (const auto& m : retired_) bytes += static_cast<int64_t>(m->bytes());
  return bytes;
}

bool Stripe::Reserve(int64_t rows) {
  const uint64_t cap = current_ ? current_->capacity() : 0;
  if (static_cast<uint64_t>(rows) * 2 <= cap) return true;
  uint64_t grown_cap = cap == 0 ? 16 : cap * 2;
  while (grown_cap < static_cast<uint64_t>(rows) * 2) grown_cap *= 2;
  std::unique_ptr<IdMap> grown = IdMap::Create(grown_cap);
  if (!grown) return false;
  if (current_) {
    const MapEntry* old = current_->entries();
    for (uint64_t pos = 0; pos < cap; ++pos) {
      if (old[pos].row != nullptr) grown->Place(old[pos].id, MapHash(old[pos].id), old[pos].row);
    }
    retired_.push_back(std::move(current_));
  }
  // A reader still probing the old map finds what the new one holds: it is unchanged.
  current_ = std::move(grown);
  published_.store(current_.get(), std::memory_order_seq_cst);
  return true;
}

float* Stripe::AllocateRow(int stride_floats) {
  if (!free_rows_.empty()) {
    float* row = free_rows_.back();
    free_rows_.pop_back();
    return row;
  }
  if (bump_left_ == 0) {
    const int64_t rows = next_slab_rows_;
    const size_t bytes = static_cast<size_t>(rows) * stride_floats * sizeof(float);
    AlignedBlock slab(bytes, /*zeroed=*/false);  // every row is written when it is made
    if (slab.empty()) return nullptr;
    bump_ = static_cast<float*>(slab.data());
    bump_left_ = rows;
    slab_bytes_ += static_cast<int64_t>(slab.bytes());
    slabs_.push_back(std::move(slab));
    if (bytes < kMaxSlabBytes) next_slab_rows_ *= 2;
  }
  float* row = bump_;
  bump_ += stride_floats;
  --bump_left_;
  return row;
}

float* Stripe::Insert(int64_t id, uint64_t h, int stride_floats) {
  if (!ReserveOne()) return nullptr;
  float* row = AllocateRow(stride_floats);
  if (row == nullptr) return nullptr;
  BeginChange();
  current_->Place(id, h, row);
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
