#include "trainer/next_step.h"

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace tessera::trainer {

std::string NextStepAfter(const absl::Status& s, bool checkpoints, const std::string& model) {
  const std::string resume =
      checkpoints ? "then run again with --resume=auto: it goes on from the newest checkpoint"
                  : "then run again (with --checkpoint_every, a run can go on from its last "
                    "checkpoint)";
  const Cause cause = CauseOf(s);
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
      // A data-parallel partner, not a server, is what is missing.
      if (cause == Cause::kWorker) {
        return absl::StrCat(
            "start (or restart) the worker(s) named above with the same --coordinator, "
            "--model and --num_workers (--worker_timeout_s and --rendezvous_timeout_s wait "
            "longer), ",
            resume);
      }
      if (s.code() == absl::StatusCode::kAborted) return "";  // its message says what to do
      return absl::StrCat(
          "bring back the server named above (tessera-shard or tessera-coordinator; "
          "--max_retries waits longer for one that restarts), ",
          resume);
    case absl::StatusCode::kDataLoss:
      // An input file that is damaged: nothing of the model is.
      if (cause == Cause::kInputFile) {
        return absl::StrCat(
            "copy or compress the input file named above again (the model's "
            "tables are not affected), ",
            resume);
      }
      return absl::StrCat("restore a checkpoint (tessera-cli restore --model=", model, "), ",
                          resume);
    case absl::StatusCode::kInternal:
      return absl::StrCat("see the message above, ", resume);
    default:
      return "";
  }
}

}  // namespace tessera::trainer
