// EmbeddingTable's rows in and out: single rows, imports, scans and the dirty set.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "embedding/embedding_table.h"
#include "embedding/internal/admission.h"
#include "embedding/internal/fixed_rows.h"
#include "embedding/internal/row_store.h"
#include "embedding/internal/stripe.h"
#include "embedding/internal/stripe_groups.h"
#include "embedding/internal/stripe_plan.h"

namespace tessera::embedding {

using embedding_internal::ForEachGroup;
using embedding_internal::IdMap;
using embedding_internal::kNoRow;
using embedding_internal::kStripeShift;
using embedding_internal::MapEntry;
using embedding_internal::MapHash;
using embedding_internal::MapId;
using embedding_internal::StripePlan;
using embedding_internal::StripeWriter;

absl::StatusOr<RowSnapshot> EmbeddingTable::ReadRow(int64_t id) const {
  if (fixed_ != nullptr) {
    RowSnapshot snap;
    bool found = false;
    if (fixed_->Holds(id)) {
      ReadRows({id}, [&](int64_t, const float* w, const float* state, const RowMeta& meta) {
        snap.weights.assign(w, w + dim_);
        snap.state.assign(state, state + state_floats_);
        snap.meta = meta;
        found = true;
      });
    }
    if (found) return snap;
    return absl::NotFoundError(absl::StrCat("table '", name(), "': no row for id ", id));
  }
  const uint64_t h = MapHash(id);
  const Stripe& stripe = stripes_[h >> kStripeShift];
  absl::ReaderMutexLock lock(&stripe.mu);
  const Row row = stripe.Find(h);
  if (row == kNoRow) {
    return absl::NotFoundError(absl::StrCat("table '", name(), "': no row for id ", id));
  }
  RowSnapshot snap;
  snap.weights.resize(dim_);
  CopyWeightsOut(WeightsOf(row), snap.weights.data());
  snap.state.assign(StateOf(row), StateOf(row) + state_floats_);
  snap.meta = MetaOf(row);
  return snap;
}

void EmbeddingTable::ReadRows(absl::Span<const int64_t> ids, const RowFn& fn) const {
  if (fixed_ != nullptr) {
    const embedding_internal::FixedRows& f = *fixed_;
    for (const int64_t id : ids) {
      if (!f.Holds(id)) continue;
      const int64_t row = f.RowOf(id);
      absl::ReaderMutexLock lock(&FixedStripe(row).mu);
      if (!f.Live(row)) continue;
      RowMeta meta;
      meta.update_count = f.Count(row);
      fn(id, WeightsView(f.Weights(row)), f.State(row), meta);
    }
    return;
  }
  for (const int64_t id : ids) {
    const uint64_t h = MapHash(id);
    const Stripe& stripe = stripes_[h >> kStripeShift];
    absl::ReaderMutexLock lock(&stripe.mu);
    if (const Row row = stripe.Find(h); row != kNoRow) {
      fn(id, WeightsView(WeightsOf(row)), StateOf(row), MetaOf(row));
    }
  }
}

absl::Status EmbeddingTable::PutRowLocked(Stripe& stripe, uint64_t h, const float* weights,
                                          const float* state, const RowMeta& meta,
                                          bool mark_dirty) {
  Row row = stripe.Find(h);
  if (row == kNoRow) {
    TESSERA_RETURN_IF_ERROR(TakeRows(1));
    // Not initialised: every field is written below.
    row = stripe.Insert(h);
    if (row == kNoRow) {
      AdjustRows(-1);
      return OutOfMemoryError();
    }
  }
  NoteStep(meta.last_step);
  stripe.BeginChange();
  StoreWeights(weights, WeightsOf(row));
  std::copy(state, state + state_floats_, StateOf(row));
  SetMeta(row, meta);
  if (mark_dirty) MarkDirtyLocked(stripe, row);
  return absl::OkStatus();
}

absl::Status EmbeddingTable::PutRow(int64_t id, absl::Span<const float> weights,
                                    absl::Span<const float> state, const RowMeta& meta,
                                    bool mark_dirty) {
  if (weights.size() != static_cast<size_t>(dim_) ||
      state.size() != static_cast<size_t>(state_floats_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", name(), "': row ", id, " has ", weights.size(), " weights and ",
                     state.size(), " state floats, expected ", dim_, " and ", state_floats_));
  }
  if (fixed_ != nullptr) return FixedPutRow(id, weights.data(), state.data(), meta, mark_dirty);
  const uint64_t h = MapHash(id);
  Stripe& stripe = stripes_[h >> kStripeShift];
  StripeWriter lock(stripe);
  return PutRowLocked(stripe, h, weights.data(), state.data(), meta, mark_dirty);
}

absl::Status EmbeddingTable::Reserve(int64_t rows) {
  if (fixed_ != nullptr) return absl::OkStatus();  // every row has its place
  // Ids spread over the stripes evenly, give or take a few standard deviations.
  const int64_t per_stripe = rows / kNumStripes;
  const int64_t want = per_stripe + 4 * static_cast<int64_t>(std::sqrt(per_stripe)) + 16;
  for (int s = 0; s < kNumStripes; ++s) {
    StripeWriter lock(stripes_[s]);
    if (!stripes_[s].Reserve(want)) return OutOfMemoryError();
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::PutRows(absl::Span<const int64_t> ids, const float* weights,
                                     const float* state, absl::Span<const RowMeta> metas) {
  if (fixed_ != nullptr) {
    for (size_t i = 0; i < ids.size(); ++i) {
      TESSERA_RETURN_IF_ERROR(FixedPutRow(ids[i], weights + i * dim_, state + i * state_floats_,
                                          metas[i], /*mark_dirty=*/false));
    }
    return absl::OkStatus();
  }
  StripePlan& plan = embedding_internal::PlanByStripe(ids);
  return ForEachGroup(plan, [&](int s, int b, int e) {
    Stripe& stripe = stripes_[s];
    StripeWriter lock(stripe);
    for (int k = b; k < e; ++k) {
      const size_t pos = static_cast<size_t>(plan.order[k]);
      TESSERA_RETURN_IF_ERROR(PutRowLocked(stripe, plan.sorted[k], weights + pos * dim_,
                                           state + pos * state_floats_, metas[pos],
                                           /*mark_dirty=*/false));
    }
    return absl::OkStatus();
  });
}

void EmbeddingTable::Forget(int64_t id) {
  if (fixed_ != nullptr) return FixedForget(id);
  const uint64_t h = MapHash(id);
  Stripe& stripe = stripes_[h >> kStripeShift];
  StripeWriter lock(stripe);
  EraseLocked(stripe, h);
}

void EmbeddingTable::ForEachDirtyRow(const RowFn& fn) const {
  if (fixed_ != nullptr) return FixedForEach(fn, /*dirty_only=*/true);
  if (DirtyRows() > 0) ScanRows(fn, /*dirty_only=*/true);
}

void EmbeddingTable::ScanRows(const RowFn& fn, bool dirty_only) const {
  for (int s = 0; s < kNumStripes; ++s) {
    const Stripe& stripe = stripes_[s];
    absl::ReaderMutexLock lock(&stripe.mu);
    const IdMap* map = stripe.current();
    for (uint64_t pos = 0; map != nullptr && pos < map->capacity(); ++pos) {
      const MapEntry& e = map->Slot(pos);
      if (e.row == kNoRow || (dirty_only && !rows_->Dirty(e.row))) continue;
      fn(MapId(e.hash), WeightsView(WeightsOf(e.row)), StateOf(e.row), MetaOf(e.row));
    }
  }
}

int64_t EmbeddingTable::DirtyRows() const {
  if (fixed_ != nullptr) return fixed_->dirty_rows();
  return dirty_rows_.load(std::memory_order_relaxed);
}

void EmbeddingTable::ClearDirty() {
  if (fixed_ != nullptr) return FixedClearDirty();
  for (int s = 0; s < kNumStripes && DirtyRows() > 0; ++s) {
    Stripe& stripe = stripes_[s];
    StripeWriter lock(stripe);
    const IdMap* map = stripe.current();
    for (uint64_t pos = 0; map != nullptr && pos < map->capacity(); ++pos) {
      const uint32_t row = map->Slot(pos).row;
      if (row != kNoRow && rows_->ClearDirty(row)) {
        dirty_rows_.fetch_sub(1, std::memory_order_relaxed);
      }
    }
  }
}

void EmbeddingTable::ForEachRow(const RowFn& fn) const {
  if (fixed_ != nullptr) return FixedForEach(fn, /*dirty_only=*/false);
  ScanRows(fn, /*dirty_only=*/false);
}

int64_t EmbeddingTable::MemoryBytes() const {
  int64_t bytes = ReservedBytes() + (fixed_ == nullptr ? rows_->Bytes() : 0);
  for (int s = 0; s < kNumStripes; ++s) {
    absl::ReaderMutexLock lock(&stripes_[s].mu);
    bytes += stripes_[s].Bytes();
  }
  return bytes;
}

int64_t EmbeddingTable::ReservedBytes() const {
  return (fixed_ != nullptr ? fixed_->ReservedBytes() : 0) +
         (admission_ != nullptr ? admission_->bytes() : 0);
}

}  // namespace tessera::embedding
