// tessera-cli checkpoint.
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "tools/cli/cli.h"

namespace tessera::cli {

int TakeCheckpoint(client::EmbeddingClient& tables, const std::string&) {
  const int64_t step = absl::GetFlag(FLAGS_step);
  if (step < 0) {
    return Refuse(step == -1 ? "checkpoint needs --step (the training step it is taken at)"
                             : absl::StrCat("checkpoint --step must be >= 0, got ", step));
  }
  embedding::CheckpointOptions options;
  options.model = absl::GetFlag(FLAGS_model);
  absl::StatusOr<embedding::CheckpointInfo> taken = tables.Checkpoint(step, {}, options);
  if (!taken.ok()) return Fail("checkpoint", taken.status());
  std::printf("checkpoint taken: ");
  PrintCheckpoint(*taken);
  return 0;
}

}  // namespace tessera::cli
