#ifndef TESSERA_EMBEDDING_INTERNAL_STRIPE_PLAN_H_
#define TESSERA_EMBEDDING_INTERNAL_STRIPE_PLAN_H_

// A batch's ids grouped by stripe, so each stripe is visited once per batch (one lock
// for writers, one validation run for readers) and the row loads of many ids are in
// flight together.

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace tessera::embedding_internal {

constexpr int kNumStripes = 64;

struct StripePlan {
  std::vector<uint64_t> hash;    // (ids) map hash of each id: PlanByStripe's own scratch
  std::vector<int32_t> order;    // positions of the ids, grouped by stripe
  std::vector<uint64_t> sorted;  // (ids) map hash of the id at order[k]: what callers read
  std::vector<int32_t> begin;    // (stripes + 1) group bounds in `order`
  std::vector<uint32_t> rows;    // (ids) row number found for order[k], or kNoRow
  std::vector<int32_t> missing;  // positions whose row does not exist
};

// The plan of `ids` in a per-thread buffer that the next call on this thread reuses.
StripePlan& PlanByStripe(absl::Span<const int64_t> ids);

}  // namespace tessera::embedding_internal

#endif  // TESSERA_EMBEDDING_INTERNAL_STRIPE_PLAN_H_
