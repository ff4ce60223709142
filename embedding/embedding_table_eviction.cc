// EmbeddingTable's row budget under an eviction policy (LRU by last update step, LFU by
// update count, both sampled from the map) and TTL expiry: which row leaves, where it
// goes (the table's RowSpill) and how a row comes back from there.

#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "embedding/embedding_table.h"
#include "embedding/internal/admission.h"
#include "embedding/internal/stripe.h"

namespace tessera::embedding {

using embedding_internal::IdMap;
using embedding_internal::kNoRow;
using embedding_internal::kStripeShift;
using embedding_internal::MapEntry;
using embedding_internal::MapHash;
using embedding_internal::MapId;
using embedding_internal::StripeWriter;

absl::Status EmbeddingTable::SetRowBudget(int64_t row_budget) {
  if (fixed_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("table '", name(), "' has a fixed vocabulary: no row budget"));
  }
  row_budget_.store(row_budget, std::memory_order_relaxed);
  if (row_budget <= 0 || policy_ == v1::EVICTION_NONE) return absl::OkStatus();
  // Evicted down to it, a row of each stripe in turn.
  while (num_rows() > row_budget) {
    const int64_t before = num_rows();
    for (int s = 0; s < kNumStripes && num_rows() > row_budget; ++s) {
      StripeWriter lock(stripes_[s]);
      if (stripes_[s].size() > 0) TESSERA_RETURN_IF_ERROR(EvictOneLocked(stripes_[s]));
    }
    if (num_rows() >= before) break;  // nothing left to evict
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::EvictOneLocked(Stripe& stripe) {
  if (stripe.size() == 0) {
    // Evict from another stripe whose lock is free right now (waiting could deadlock with
    // a thread doing the same the other way round); if none is, go one row over budget.
    for (int k = 1; k < kNumStripes; ++k) {
      Stripe& other = stripes_[(&stripe - stripes_.get() + k) % kNumStripes];
      if (!other.mu.TryLock()) continue;
      const bool has_rows = other.size() > 0;
      absl::Status s = has_rows ? EvictOneLocked(other) : absl::OkStatus();
      StripeWriter::Release(other);
      if (!s.ok() || has_rows) return s;
    }
    return absl::OkStatus();
  }
  // Sample up to 8 rows from a random place in the map and evict the coldest of them.
  constexpr int kSamples = 8;
  uint64_t& x = stripe.sample_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  const IdMap& map = *stripe.current();
  uint64_t pos = x % map.capacity();
  const MapEntry* victim = nullptr;
  RowMeta victim_meta;
  auto colder = [this](const RowMeta& ma, const RowMeta& mb) {
    if (policy_ == v1::EVICTION_LFU) {
      return ma.update_count != mb.update_count ? ma.update_count < mb.update_count
                                                : ma.last_step < mb.last_step;
    }
    return ma.last_step != mb.last_step ? ma.last_step < mb.last_step
                                        : ma.update_count < mb.update_count;
  };
  for (int found = 0; found < kSamples && found < stripe.size();
       pos = pos + 1 == map.capacity() ? 0 : pos + 1) {
    const MapEntry& e = map.Slot(pos);
    if (e.row == kNoRow) continue;
    ++found;
    const RowMeta meta = MetaOf(e.row);
    if (victim == nullptr || colder(meta, victim_meta)) {
      victim = &e;
      victim_meta = meta;
    }
  }
  const uint64_t hash = victim->hash;
  const Row row = victim->row;
  if (spill_ != nullptr) {
    TESSERA_RETURN_IF_ERROR(spill_->Evict(MapId(hash), WeightsView(WeightsOf(row)), StateOf(row),
                                          victim_meta, rows_->Dirty(row)));
  }
  EraseLocked(stripe, hash);
  evictions_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::StatusOr<EmbeddingTable::Row> EmbeddingTable::InsertManagedLocked(Stripe& stripe,
                                                                        int64_t id,
                                                                        uint64_t hash) {
  if ((row_budget() > 0 && num_rows() >= row_budget()) ||
      (memory_ != nullptr && !memory_->HasRoomFor(row_bytes_))) {
    TESSERA_RETURN_IF_ERROR(EvictOneLocked(stripe));
  }
  // Counted without a budget check: the eviction above made the room (a concurrent
  // insert may take the table one row over for a moment).
  AdjustRows(1);
  const Row row = InsertLocked(stripe, id, hash);
  if (row == kNoRow) {
    AdjustRows(-1);
    return OutOfMemoryError();
  }
  if (spill_ != nullptr) {
    RowMeta meta;
    bool dirty = false;
    thread_local std::vector<float> weights;
    weights.resize(dim_);
    absl::StatusOr<bool> kept = spill_->Fetch(id, weights.data(), StateOf(row), &meta, &dirty);
    if (!kept.ok()) {
      EraseLocked(stripe, hash);
      return kept.status();
    }
    const int64_t latest = latest_step_.load(std::memory_order_relaxed);
    if (*kept && ttl_steps_ > 0 && latest - meta.last_step > ttl_steps_) {
      spill_->Drop(id);  // expired while on disk: starts afresh
      InitRow(id, row);
      expirations_.fetch_add(1, std::memory_order_relaxed);
    } else if (*kept) {
      StoreWeights(weights.data(), WeightsOf(row));
      NoteStep(meta.last_step);
      SetMeta(row, meta);
      if (dirty) MarkDirtyLocked(stripe, row);
    }
  }
  return row;
}

absl::StatusOr<bool> EmbeddingTable::ReadSpilled(int64_t id, float* weights) const {
  if (spill_ == nullptr) return false;
  thread_local std::vector<float> scratch, state;
  if (weights == nullptr) {
    scratch.resize(dim_);
    weights = scratch.data();
  }
  state.resize(state_floats_);
  RowMeta meta;
  bool dirty = false;
  return spill_->Fetch(id, weights, state.data(), &meta, &dirty);
}

absl::Status EmbeddingTable::ApplyManaged(absl::Span<const int64_t> ids, const float* grads,
                                          int64_t step) {
  thread_local std::vector<float> scratch;
  scratch.resize(ScratchFloats());
  int64_t refused = 0, first_refused = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint64_t h = MapHash(ids[i]);
    Stripe& stripe = stripes_[h >> kStripeShift];
    StripeWriter lock(stripe);
    Row row = stripe.Find(h);
    if (row == kNoRow && admission_ != nullptr && !admission_->Count(ids[i], h)) {
      // Not admitted, unless a row of it is kept on disk (evicted before a restart that
      // emptied the sketch): such a row was admitted already.
      TESSERA_ASSIGN_OR_RETURN(const bool kept, ReadSpilled(ids[i], nullptr));
      if (!kept) {
        refused_ids_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
    }
    if (row == kNoRow) {
      TESSERA_ASSIGN_OR_RETURN(row, InsertManagedLocked(stripe, ids[i], h));
    }
    if (!UpdateRowLocked(stripe, ids[i], row, grads + i * dim_, step, scratch.data()) &&
        refused++ == 0) {
      first_refused = ids[i];
    }
  }
  return refused == 0 ? absl::OkStatus() : NonFiniteUpdateError(refused, first_refused);
}

void EmbeddingTable::ExpireRows(int64_t step) {
  std::vector<uint64_t> expired;  // map hashes
  for (int s = 0; s < kNumStripes; ++s) {
    Stripe& stripe = stripes_[s];
    StripeWriter lock(stripe);
    expired.clear();
    const IdMap* map = stripe.current();
    for (uint64_t pos = 0; map != nullptr && pos < map->capacity(); ++pos) {
      const MapEntry& e = map->Slot(pos);
      if (e.row != kNoRow && step - MetaOf(e.row).last_step > ttl_steps_) {
        expired.push_back(uint64_t{e.hash});  // a copy: the packed field is unaligned
      }
    }
    for (const uint64_t hash : expired) {
      EraseLocked(stripe, hash);
      if (spill_ != nullptr) spill_->Drop(MapId(hash));
    }
    expirations_.fetch_add(static_cast<int64_t>(expired.size()), std::memory_order_relaxed);
  }
}

}  // namespace tessera::embedding
