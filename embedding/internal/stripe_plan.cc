#include "embedding/internal/stripe_plan.h"

#include "embedding/internal/stripe.h"

namespace tessera::embedding_internal {

StripePlan& PlanByStripe(absl::Span<const int64_t> ids) {
  thread_local StripePlan plan;
  const size_t n = ids.size();
  plan.hash.resize(n);
  plan.order.resize(n);
  plan.sorted.resize(n);
  plan.rows.resize(n);
  plan.missing.clear();
  // Hashing alone, so the loop vectorises (64-bit multiplies over the batch).
  const int64_t* in = ids.data();
  uint64_t* hash = plan.hash.data();
  for (size_t i = 0; i < n; ++i) hash[i] = MapHash(in[i]);
  // Counts in begin[s + 1], then prefix sums, then a stable scatter with begin[s] as the
  // cursor, which leaves begin[s] at the group's end: shifted back once at the end.
  plan.begin.assign(kNumStripes + 1, 0);
  for (size_t i = 0; i < n; ++i) ++plan.begin[(hash[i] >> kStripeShift) + 1];
  for (int s = 0; s < kNumStripes; ++s) plan.begin[s + 1] += plan.begin[s];
  for (size_t i = 0; i < n; ++i) {
    const int32_t k = plan.begin[hash[i] >> kStripeShift]++;
    plan.order[k] = static_cast<int32_t>(i);
    plan.sorted[k] = hash[i];
  }
  for (int s = kNumStripes; s > 0; --s) plan.begin[s] = plan.begin[s - 1];
  plan.begin[0] = 0;
  return plan;
}

}  // namespace tessera::embedding_internal
