#ifndef TESSERA_EMBEDDING_INTERNAL_STRIPE_GROUPS_H_
#define TESSERA_EMBEDDING_INTERNAL_STRIPE_GROUPS_H_

// The probe pipeline an EmbeddingTable runs over a batch's ids, stripe by stripe
// (StripePlan): how far ahead it prefetches, and the group walk its lookups, updates and
// row reads share. Inline: it is the inner loop of each.

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "base/status.h"
#include "embedding/internal/row_store.h"
#include "embedding/internal/stripe.h"
#include "embedding/internal/stripe_plan.h"
#include "embedding/prefetch.h"

namespace tessera::embedding_internal {

// Ids probed (and their rows prefetched) before the first of them is used; for lookups
// also the unit read again when a writer got in the way. (A batch of 4,096 ids gives a
// stripe about 64: a chunk of 32 drained the pipeline twice as often, measured 2-3%
// slower on gathers from 1 GiB tables.)
constexpr int kChunk = 64;
// How far ahead of its use an id's map bucket is prefetched (FindGroup, WarmRows).
constexpr int kProbeAhead = 8;
// Optimistic reads of one chunk before a lookup takes the stripe's lock.
constexpr int kOptimisticTries = 8;

// A batch this small leaves a stripe's group fewer ids than the group's own probe pipeline
// (8 ahead) needs to overlap their memory loads: the table warms its rows across groups
// first (WarmRows). A shard's part of a batch is often this thin.
inline bool ThinGroups(size_t ids) {
  return ids < 8 * static_cast<size_t>(embedding_internal::kNumStripes);
}

// Brings what a write of row `row` of `rows` reads besides its weights towards the cache:
// its state and meta, and its dirty bit's word (one row in 64 shares it, so nearly every
// update's test of the bit would otherwise wait for memory).
inline void PrefetchRowForWrite(const RowStore& rows, uint32_t row) {
  embedding::PrefetchBytes(rows.State(row), rows.cold_bytes(), true);
  embedding::PrefetchLine(rows.DirtyWordOf(row), true);
}

// Brings row `row` of `rows` towards the cache: its weights, and for a write its state
// and meta too.
inline void PrefetchRow(const RowStore& rows, uint32_t row, bool for_write) {
  embedding::PrefetchBytes(rows.Weights(row), rows.weight_bytes(), for_write);
  if (for_write) PrefetchRowForWrite(rows, row);
}

// Finds the rows of group [b, e) of `plan` in `map` (under its stripe's lock, or validated
// by a lock-free reader afterwards) into plan.rows[b..e): the first map bucket of id j is
// prefetched while id j - 8 is looked up and its row prefetched (when `prefetch`), so the
// caller's pass over the rows that follows finds them on their way. An id its first
// bucket does not settle has its second bucket prefetched and is looked up after the
// others (a miss then overlaps the group's work instead of stalling it). A row number
// that is not the store's (read torn beside a writer) counts as none.
inline void FindGroup(const IdMap* map, const RowStore& rows, StripePlan& plan, int b, int e,
                      bool prefetch, bool for_write) {
  uint32_t* const found_rows = plan.rows.data();
  if (map == nullptr) {
    std::fill(found_rows + b, found_rows + e, kNoRow);
    return;
  }
  constexpr int kMaxDeferred = 64;
  int deferred[kMaxDeferred];
  int num_deferred = 0;
  // What the loop reads, in locals: its stores of row numbers would otherwise make the
  // compiler reload the map's and the store's fields after each (a uint32_t may alias
  // their ints).
  const IdMap::Probe probe = map->probe();
  const RowStore::Addresses at = rows.addresses();
  const int weight_bytes = rows.weight_bytes();
  const uint64_t* const hash = plan.sorted.data();
  // Rows handed out later than this are counted as not found (the caller's locked path
  // finds them): every row number read stays below it unless read torn.
  const uint32_t handed_out = rows.HandedOut();
  auto found = [&](int k, uint32_t row) {
    if (row >= handed_out) row = kNoRow;
    found_rows[k] = row;
    if (row == kNoRow || !prefetch) return;
    embedding::PrefetchBytes(at.Weights(row), weight_bytes, for_write);  // PrefetchRow's
    if (for_write) PrefetchRowForWrite(rows, row);
  };
  for (int j = b; j < e + kProbeAhead; ++j) {
    if (j < e) probe.Prefetch(hash[j]);
    const int k = j - kProbeAhead;
    if (k < b) continue;
    uint32_t row;
    if (probe.FindInFirst(hash[k], &row)) {
      found(k, row);
    } else if (num_deferred < kMaxDeferred) {
      probe.PrefetchSecond(hash[k]);
      deferred[num_deferred++] = k;
    } else {
      found(k, probe.FindInSecond(hash[k]));
    }
  }
  for (int d = 0; d < num_deferred; ++d) {
    found(deferred[d], probe.FindInSecond(hash[deferred[d]]));
  }
}

// Calls fn(stripe, begin, end) for every stripe with ids in `plan`, in stripe order, with
// the ids' group [begin, end) of plan.order; stops at fn's first error and returns it.
template <typename Fn>
absl::Status ForEachGroup(const StripePlan& plan, Fn&& fn) {
  for (int s = 0; s < embedding_internal::kNumStripes; ++s) {
    if (plan.begin[s] == plan.begin[s + 1]) continue;
    TESSERA_RETURN_IF_ERROR(fn(s, plan.begin[s], plan.begin[s + 1]));
  }
  return absl::OkStatus();
}

}  // namespace tessera::embedding_internal

#endif  // TESSERA_EMBEDDING_INTERNAL_STRIPE_GROUPS_H_
