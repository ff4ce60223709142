// tessera-cli checkpoints.
#include <cstdio>
#include <string>
#include <vector>

#include "tools/cli/cli.h"

namespace tessera::cli {

int Checkpoints(client::EmbeddingClient& tables, const std::string&) {
  absl::StatusOr<std::vector<embedding::CheckpointInfo>> listed = tables.ListCheckpoints();
  if (!listed.ok()) return Fail("checkpoints", listed.status());
  if (listed->empty()) std::printf("no complete checkpoints\n");
  for (const embedding::CheckpointInfo& c : *listed) PrintCheckpoint(c);
  return 0;
}

}  // namespace tessera::cli
