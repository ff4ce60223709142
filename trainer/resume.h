#ifndef TESSERA_TRAINER_RESUME_H_
#define TESSERA_TRAINER_RESUME_H_

// Resuming a run from its model's newest checkpoint: on one trainer, or on every worker of
// a data-parallel job, where worker 0 restores and hands its dense state to the others.

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainer/data_parallel.h"
#include "trainer/dense_backend.h"
#include "trainer/trainer.h"

namespace tessera::trainer {

// What worker 0 found when it resumed, as it sends it to the other workers.
struct ResumeOffer {
  enum class Kind : char {
    kRestored = 'S',  // checkpoint `step`, with worker 0's dense state
    kFresh = 'N',     // no checkpoint, untouched tables: step 0
    kRefused = 'E',   // `reason`: the run must not go on
  };
  Kind kind = Kind::kFresh;
  int64_t step = 0;
  std::string dense_state;
  std::string reason;
};
std::string EncodeResumeOffer(const ResumeOffer& offer);
// InternalError for bytes that EncodeResumeOffer did not make.
absl::StatusOr<ResumeOffer> DecodeResumeOffer(absl::string_view bytes);

// --resume: restores model `model`'s newest checkpoint and returns its step (0 when there
// is none and its tables are untouched; FailedPrecondition when there is none but its
// tables hold trained rows: a new dense network would train over them). Data-parallel
// (`dp` of more than one worker), worker 0 restores the tables and its dense state and
// sends that state to the others; every worker then checks that they all hold the same
// step and dense parameters.
absl::StatusOr<int64_t> ResumeOnEveryWorker(Trainer& trainer, DenseBackend* dense, DataParallel* dp,
                                            const std::string& model);

// InternalError (what `differs` says of the first worker that differs) unless every
// worker of `dp` passed the same `mine`.
absl::Status SameOnEveryWorker(DataParallel* dp, const std::string& mine,
                               const std::function<std::string(int worker)>& differs);

// Data-parallel: every worker's dense model must be the same bits. Returns their
// fingerprint; InternalError names a worker whose parameters differ from worker 0's.
absl::StatusOr<uint64_t> CheckSameDenseModel(DataParallel* dp, DenseBackend* dense);

}  // namespace tessera::trainer

#endif  // TESSERA_TRAINER_RESUME_H_
