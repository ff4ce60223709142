#ifndef TESSERA_TRAINER_TRAIN_LEGS_H_
#define TESSERA_TRAINER_TRAIN_LEGS_H_

// A run's training to the end of its input, in legs: when a shard restarts and the model
// goes back to its newest checkpoint, the next leg trains again from there.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "trainer/data_parallel.h"
#include "trainer/input_pipeline.h"
#include "trainer/trainer.h"

namespace tessera::trainer {

// What the legs of a run came to.
struct TrainedLegs {
  TrainResult result;     // summed over the legs
  int64_t last_step = 0;  // the step the model is at when training ends
  int64_t replayed = 0;   // steps trained again after shard restarts
};

// The batches from step `first_step` on: a resumed run, or one that went back to a
// checkpoint, reads what it read then.
using SourceFrom = std::function<absl::StatusOr<std::unique_ptr<BatchSource>>(int64_t first_step)>;

// Trains from `first_step` to step `steps` (0: the end of the input), going back to the
// newest checkpoint when a shard restarts (more than 10 times is Aborted). Each leg's
// source stops at the end of a step once `*stop` is set and, data-parallel, ends on every
// worker at once. *source holds the last leg's source on return (what its reader counted
// is read from it before it goes).
absl::StatusOr<TrainedLegs> TrainWithRecovery(Trainer& trainer, const SourceFrom& source_from,
                                              DataParallel* dp, const std::atomic<bool>* stop,
                                              int64_t steps, int64_t first_step,
                                              std::unique_ptr<BatchSource>* source);

}  // namespace tessera::trainer

#endif  // TESSERA_TRAINER_TRAIN_LEGS_H_
