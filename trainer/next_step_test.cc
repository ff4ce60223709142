#include "trainer/next_step.h"

#include "base/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::trainer {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(NextStepAfter, AMissingWorkerIsToldByItsCauseNotByItsWords) {
  for (const absl::Status& s : {absl::UnavailableError("job 'm': could not connect"),
                                absl::DeadlineExceededError("rendezvous timed out"),
                                absl::AbortedError("step 7: some partner did not push")}) {
    EXPECT_THAT(NextStepAfter(WithCause(s, Cause::kWorker), false, "m"),
                StartsWith("start (or restart) the worker(s) named above"))
        << s;
  }
  // The word alone is not the cause: a shard that is down, named in a message that
  // mentions workers, is a server to bring back; an ABORTED run says what to do itself.
  EXPECT_THAT(NextStepAfter(absl::UnavailableError("shard 1 (every worker waits)"), false, "m"),
              StartsWith("bring back the server named above"));
  EXPECT_EQ(NextStepAfter(absl::AbortedError("shard 0 restarted; run every worker again with "
                                             "--resume=auto"),
                          true, "m"),
            "");
}

TEST(NextStepAfter, ADamagedInputFileIsNotTheModelsData) {
  const absl::Status corrupt = absl::DataLossError("'a.tsv.gz' is corrupt or truncated");
  EXPECT_THAT(NextStepAfter(WithCause(corrupt, Cause::kInputFile), true, "m"),
              StartsWith("copy or compress the input file named above again"));
  EXPECT_THAT(NextStepAfter(corrupt, true, "ads"),
              StartsWith("restore a checkpoint (tessera-cli restore --model=ads)"));
}

TEST(NextStepAfter, TheCauseSurvivesContextAndTheResumeAdviceFollowsTheRun) {
  const absl::Status annotated =
      Annotate(WithCause(absl::AbortedError("allreduce failed"), Cause::kWorker), "step 3");
  EXPECT_EQ(CauseOf(annotated), Cause::kWorker);
  EXPECT_THAT(NextStepAfter(annotated, true, "m"), HasSubstr("run again with --resume=auto"));
  EXPECT_THAT(NextStepAfter(annotated, false, "m"), HasSubstr("with --checkpoint_every"));
  EXPECT_EQ(NextStepAfter(absl::InvalidArgumentError("--steps"), true, "m"), "");
  EXPECT_EQ(CauseOf(absl::AbortedError("x")), Cause::kNone);
}

}  // namespace
}  // namespace tessera::trainer
