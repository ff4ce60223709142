// EmbeddingTable's updates: a batch's gradients applied stripe by stripe under its lock.
#include <algorithm>

#include "absl/synchronization/mutex.h"
#include "base/check.h"
#include "base/status.h"
#include "embedding/batch_ops.h"
#include "embedding/embedding_table.h"
#include "embedding/internal/admission.h"
#include "embedding/internal/fixed_rows.h"
#include "embedding/internal/reader_epochs.h"
#include "embedding/internal/row_ops.h"
#include "embedding/internal/stripe.h"
#include "embedding/internal/stripe_groups.h"
#include "embedding/internal/stripe_plan.h"

namespace tessera::embedding {

using embedding_internal::FindGroup;
using embedding_internal::ForEachGroup;
using embedding_internal::kChunk;
using embedding_internal::kNoRow;
using embedding_internal::ReaderScope;
using embedding_internal::StripePlan;
using embedding_internal::StripeWriter;
using embedding_internal::ThinGroups;

absl::Status EmbeddingTable::ApplyUniqueGradients(absl::Span<const int64_t> ids, const float* grads,
                                                  int64_t step) {
  TESSERA_RETURN_IF_ERROR(CheckFiniteGradients(name(), ids, grads, dim_));
  return ApplyCheckedGradients(ids, grads, step);
}

absl::Status EmbeddingTable::ApplyCheckedGradients(absl::Span<const int64_t> ids,
                                                   const float* grads, int64_t step) {
  TESSERA_DCHECK(CheckFiniteGradients(name(), ids, grads, dim_).ok());
  NoteStep(step);
  absl::Status applied = fixed_ != nullptr              ? FixedApply(ids, grads, step)
                         : policy_ != v1::EVICTION_NONE ? ApplyManaged(ids, grads, step)
                                                        : ApplyBatch(ids, grads, step);
  TESSERA_RETURN_IF_ERROR(applied);
  // TTL: sweep once the step has moved a quarter of the TTL on since the last sweep.
  if (ttl_steps_ > 0) {
    int64_t due = next_sweep_.load(std::memory_order_relaxed);
    if (step >= due &&
        next_sweep_.compare_exchange_strong(due, step + std::max<int64_t>(1, ttl_steps_ / 4))) {
      ExpireRows(step);
    }
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::CheckRoomFor(absl::Span<const int64_t> ids) const {
  if (fixed_ != nullptr) return CheckIds(ids);  // its memory was counted whole
  if (policy_ != v1::EVICTION_NONE || !CountsAhead(static_cast<int64_t>(ids.size()))) {
    return absl::OkStatus();
  }
  const int64_t missing = MissingRows(ids);
  if (const int64_t budget = row_budget();
      missing > 0 && budget > 0 && num_rows() + missing > budget) {
    return BudgetError();
  }
  if (missing > 0 && memory_ != nullptr && !memory_->HasRoomFor(missing * row_bytes_)) {
    return MemoryBudgetError(missing);
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::ApplyBatch(absl::Span<const int64_t> ids, const float* grads,
                                        int64_t step) {
  StripePlan& plan = embedding_internal::PlanByStripe(ids);
  // With a budget, take it for the rows this batch will create, so that a full table
  // rejects the whole batch before any row changes. Without one there is nothing to check
  // and rows are counted as they are created.
  int64_t reserved = 0;
  if (CountsAhead(static_cast<int64_t>(ids.size()))) {
    (void)ForEachGroup(plan, [&](int s, int b, int e) {
      const Stripe& stripe = stripes_[s];
      absl::ReaderMutexLock lock(&stripe.mu);
      FindGroup(stripe.current(), *rows_, plan, b, e, /*prefetch=*/false, false);
      for (int k = b; k < e; ++k) {
        const int32_t pos = plan.order[k];
        reserved += plan.rows[k] == kNoRow &&
                    (admission_ == nullptr || admission_->WouldAdmit(ids[pos], plan.sorted[k]));
      }
      return absl::OkStatus();
    });
  }
  if (reserved > 0) TESSERA_RETURN_IF_ERROR(TakeRows(reserved));

  if (ThinGroups(ids.size())) {
    ReaderScope reading(*readers_);
    WarmRows(plan, /*for_write=*/true);
  }
  thread_local std::vector<float> scratch;
  scratch.resize(ScratchFloats());
  int64_t refused = 0, first_refused = 0;
  int64_t created = 0, not_admitted = 0;
  TESSERA_RETURN_IF_ERROR(ForEachGroup(plan, [&](int s, int b, int e) {
    Stripe& stripe = stripes_[s];
    StripeWriter lock(stripe);
    for (int c = b; c < e; c += kChunk) {
      const int ce = std::min(e, c + kChunk);
      // The whole row: weights, state and the meta after them (update count, step),
      // which every update reads and writes.
      FindGroup(stripe.current(), *rows_, plan, c, ce, /*prefetch=*/true, /*for_write=*/true);
      PrefetchNextBuckets(plan, ce);
      for (int k = c; k < ce; ++k) {
        const int32_t pos = plan.order[k];
        Row row = plan.rows[k];
        if (row == kNoRow && admission_ != nullptr &&
            !admission_->Count(ids[pos], plan.sorted[k])) {
          ++not_admitted;  // no row yet: the gradient is dropped
          continue;
        }
        if (row == kNoRow) {
          row = InsertLocked(stripe, ids[pos], plan.sorted[k]);
          if (row == kNoRow) {
            AdjustRows(created - reserved);
            return OutOfMemoryError();
          }
          ++created;
        }
        if (!UpdateRowLocked(stripe, ids[pos], row, grads + static_cast<size_t>(pos) * dim_, step,
                             scratch.data()) &&
            refused++ == 0) {
          first_refused = ids[pos];
        }
      }
    }
    return absl::OkStatus();
  }));
  // Another thread may have created some of the reserved rows meanwhile; without a budget
  // nothing was reserved and every created row is counted here.
  if (created != reserved) AdjustRows(created - reserved);
  if (not_admitted > 0) refused_ids_.fetch_add(not_admitted, std::memory_order_relaxed);
  return refused == 0 ? absl::OkStatus() : NonFiniteUpdateError(refused, first_refused);
}

absl::Status EmbeddingTable::PushGradients(absl::Span<const int64_t> ids, const float* grads,
                                           int64_t step) {
  thread_local SummedGradients summed;
  TESSERA_RETURN_IF_ERROR(
      SumGradients(name(), ids, absl::MakeConstSpan(grads, ids.size() * dim_), dim_, &summed));
  return ApplyCheckedGradients(summed.ids(), summed.rows(), step);
}

}  // namespace tessera::embedding
