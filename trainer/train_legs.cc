#include "trainer/train_legs.h"

#include "base/status.h"

namespace tessera::trainer {

absl::StatusOr<TrainedLegs> TrainWithRecovery(Trainer& trainer, const SourceFrom& source_from,
                                              DataParallel* dp, const std::atomic<bool>* stop,
                                              int64_t steps, int64_t first_step,
                                              std::unique_ptr<BatchSource>* source) {
  TrainedLegs out;
  int64_t start = first_step;
  out.last_step = first_step;
  for (int recoveries = 0;; ++recoveries) {
    if (recoveries > 10) {
      return absl::AbortedError(
          "shards restarted more than 10 times in one run; fix them, then run again with "
          "--resume=auto");
    }
    source->reset();
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<BatchSource> data, source_from(start));
    *source = std::make_unique<StoppableSource>(std::move(data), stop);
    // The workers' shares of a file differ by a line or so, and a signal reaches them at
    // different steps: they end together.
    if (dp != nullptr) *source = std::make_unique<AgreedEndSource>(std::move(*source), dp);
    TESSERA_ASSIGN_OR_RETURN(TrainResult leg, trainer.Train(source->get(), steps, start));
    out.result.steps += leg.steps;
    out.result.samples += leg.samples;
    out.result.seconds += leg.seconds;
    out.last_step = start + leg.steps;
    if (leg.resume_from < 0) break;
    out.replayed += out.last_step - leg.resume_from;
    start = leg.resume_from;  // a shard restarted: the model went back to this checkpoint
  }
  return out;
}

}  // namespace tessera::trainer
