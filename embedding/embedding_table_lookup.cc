// EmbeddingTable's lookups: a batch's rows found stripe by stripe, read without a lock.
#include <algorithm>

#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "embedding/dtype.h"
#include "embedding/embedding_table.h"
#include "embedding/internal/admission.h"
#include "embedding/internal/fixed_rows.h"
#include "embedding/internal/reader_epochs.h"
#include "embedding/internal/row_ops.h"
#include "embedding/internal/row_store.h"
#include "embedding/internal/stripe.h"
#include "embedding/internal/stripe_groups.h"
#include "embedding/internal/stripe_plan.h"

namespace tessera::embedding {

using embedding_internal::CopyFloats;
using embedding_internal::FindGroup;
using embedding_internal::ForEachGroup;
using embedding_internal::IdMap;
using embedding_internal::kChunk;
using embedding_internal::kNoRow;
using embedding_internal::kOptimisticTries;
using embedding_internal::kProbeAhead;
using embedding_internal::kStripeShift;
using embedding_internal::MapHash;
using embedding_internal::PrefetchRow;
using embedding_internal::ReaderScope;
using embedding_internal::RowStore;
using embedding_internal::SpinPause;
using embedding_internal::StripePlan;
using embedding_internal::StripeWriter;
using embedding_internal::ThinGroups;

void EmbeddingTable::WarmRows(const StripePlan& plan, bool for_write) const {
  const int n = static_cast<int>(plan.order.size());
  for (int j = 0; j < n + kProbeAhead; ++j) {
    if (j < n) {
      const uint64_t h = plan.sorted[j];
      if (const IdMap* map = stripes_[h >> kStripeShift].map()) map->Prefetch(h);
    }
    const int k = j - kProbeAhead;
    if (k < 0) continue;
    const uint64_t h = plan.sorted[k];
    const IdMap* map = stripes_[h >> kStripeShift].map();
    const uint32_t row = map != nullptr ? map->Find(h) : kNoRow;
    if (row != kNoRow && rows_->Valid(row)) PrefetchRow(*rows_, row, for_write);
  }
}

void EmbeddingTable::PrefetchNextBuckets(const StripePlan& plan, int from) const {
  const int end = std::min(from + kProbeAhead, static_cast<int>(plan.order.size()));
  for (int j = from; j < end; ++j) {
    const uint64_t h = plan.sorted[j];
    if (const IdMap* map = stripes_[h >> kStripeShift].map()) map->Prefetch(h);
  }
}

void EmbeddingTable::CopyGroup(const StripePlan& plan, int b, int e, float* out) const {
  // Locals, as in FindGroup: the copies' stores would make the compiler reload fields.
  const RowStore::Addresses at = rows_->addresses();
  const uint32_t* const rows = plan.rows.data();
  const int32_t* const order = plan.order.data();
  const int dim = dim_;
  if (dtype_ != v1::FP32) {
    for (int k = b; k < e; ++k) {
      if (rows[k] == kNoRow) continue;
      DecodeWeights(dtype_, at.Weights(rows[k]), dim, out + static_cast<size_t>(order[k]) * dim);
    }
    return;
  }
  for (int k = b; k < e; ++k) {
    if (rows[k] == kNoRow) continue;
    CopyFloats(out + static_cast<size_t>(order[k]) * dim, at.Weights(rows[k]), dim);
  }
}

absl::Status EmbeddingTable::Lookup(absl::Span<const int64_t> ids, float* out,
                                    bool insert_missing) {
  if (fixed_ != nullptr) return FixedLookup(ids, out);
  StripePlan& plan = embedding_internal::PlanByStripe(ids);
  {
    ReaderScope reading(*readers_);
    if (ThinGroups(ids.size())) WarmRows(plan, /*for_write=*/false);
    (void)ForEachGroup(plan, [&](int s, int b, int e) {
      const Stripe& stripe = stripes_[s];
      for (int c = b; c < e; c += kChunk) {
        const int ce = std::min(e, c + kChunk);
        // Probe a chunk (its rows' loads overlap), copy it out, and keep it when no
        // writer changed the stripe meanwhile.
        bool valid = false;
        for (int attempt = 0; attempt < kOptimisticTries && !valid; ++attempt) {
          const uint32_t begin = stripe.ReadBegin();
          if (begin & 1) {  // a writer is changing this stripe right now
            SpinPause();
            continue;
          }
          FindGroup(stripe.map(), *rows_, plan, c, ce, /*prefetch=*/true, /*for_write=*/false);
          PrefetchNextBuckets(plan, ce);
          CopyGroup(plan, c, ce, out);
          valid = stripe.ReadValid(begin);
        }
        if (!valid) {
          // Writers kept getting in the way: read under the lock instead.
          absl::ReaderMutexLock lock(&stripe.mu);
          FindGroup(stripe.current(), *rows_, plan, c, ce, /*prefetch=*/true, false);
          CopyGroup(plan, c, ce, out);
        }
        for (int k = c; k < ce; ++k) {
          if (plan.rows[k] == kNoRow) plan.missing.push_back(plan.order[k]);
        }
      }
      return absl::OkStatus();
    });
  }
  const bool managed = policy_ != v1::EVICTION_NONE;
  if (admission_ != nullptr) insert_missing = false;  // pushes make rows
  for (const int32_t pos : plan.missing) {
    const int64_t id = ids[pos];
    const uint64_t h = MapHash(id);
    float* dst = out + static_cast<size_t>(pos) * dim_;
    if (!insert_missing && !managed) {
      InitialWeights(id, dst);
      continue;
    }
    Stripe& stripe = stripes_[h >> kStripeShift];
    StripeWriter lock(stripe);
    if (const Row row = stripe.Find(h); row != kNoRow) {
      CopyWeightsOut(WeightsOf(row), dst);
      continue;
    }
    if (!insert_missing) {
      // Read-only on an evicting table: a row kept on disk is read, not brought back.
      TESSERA_ASSIGN_OR_RETURN(const bool kept, ReadSpilled(id, dst));
      if (!kept) InitialWeights(id, dst);
      continue;
    }
    TESSERA_ASSIGN_OR_RETURN(const Row row, managed ? InsertManagedLocked(stripe, id, h)
                                                    : FindOrInsertLocked(stripe, id, h));
    CopyWeightsOut(WeightsOf(row), dst);
  }
  return absl::OkStatus();
}

}  // namespace tessera::embedding
