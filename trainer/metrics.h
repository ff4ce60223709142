#ifndef TESSERA_TRAINER_METRICS_H_
#define TESSERA_TRAINER_METRICS_H_

#include "absl/types/span.h"

namespace tessera::trainer {

// Exact ROC AUC of `scores` against 0/1 `labels` (Mann-Whitney U, tied scores counted
// half). 0.5 when either class is absent.
double ExactAuc(absl::Span<const float> scores, absl::Span<const float> labels);

// Mean binary cross-entropy of probabilities (clamped to [1e-7, 1 - 1e-7]).
double LogLoss(absl::Span<const float> probabilities, absl::Span<const float> labels);

}  // namespace tessera::trainer

#endif  // TESSERA_TRAINER_METRICS_H_
