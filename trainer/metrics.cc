#include "trainer/metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace tessera::trainer {

double ExactAuc(absl::Span<const float> scores, absl::Span<const float> labels) {
  const size_t n = scores.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // Sum of the (1-based, tie-averaged) ranks of the positives.
  double positive_rank_sum = 0.0;
  double positives = 0.0;
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    double pos_in_group = 0.0;
    while (j < n && scores[order[j]] == scores[order[i]]) {
      pos_in_group += labels[order[j]] > 0.5f ? 1.0 : 0.0;
      ++j;
    }
    const double mid_rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2.0;
    positive_rank_sum += pos_in_group * mid_rank;
    positives += pos_in_group;
    i = j;
  }
  const double negatives = static_cast<double>(n) - positives;
  if (positives == 0.0 || negatives == 0.0) return 0.5;
  return (positive_rank_sum - positives * (positives + 1.0) / 2.0) / (positives * negatives);
}

double LogLoss(absl::Span<const float> probabilities, absl::Span<const float> labels) {
  if (probabilities.empty()) return 0.0;
  double total = 0.0;
  for (size_t i = 0; i < probabilities.size(); ++i) {
    const double p = std::clamp(static_cast<double>(probabilities[i]), 1e-7, 1.0 - 1e-7);
    total -= labels[i] > 0.5f ? std::log(p) : std::log(1.0 - p);
  }
  return total / static_cast<double>(probabilities.size());
}

}  // namespace tessera::trainer
