// tessera-cli reshard.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "tools/cli/cli.h"

namespace tessera::cli {

// Moves the cluster to the shards of --shards while it trains on.
int Reshard(client::EmbeddingClient& tables, const std::string&) {
  const std::vector<std::string> shards =
      absl::StrSplit(absl::GetFlag(FLAGS_shards), ',', absl::SkipEmpty());
  if (shards.empty()) {
    return Refuse(
        "reshard needs --shards=host:port,... (the new map's shards, in "
        "shard order)");
  }
  absl::StatusOr<tessera::v1::ReshardClusterResponse> resp = tables.Reshard(shards);
  if (!resp.ok()) return Fail("reshard", resp.status());
  std::printf(
      "resharded: %zu shards, shard map version %llu; %lld rows moved in %.1f s (rows "
      "updated meanwhile copied again: %lld while serving, %lld while pushes waited "
      "%.2f s), %lld applied pushes handed over\n",
      shards.size(), static_cast<unsigned long long>(resp->version()),
      static_cast<long long>(resp->rows_moved()), resp->seconds(),
      static_cast<long long>(resp->rows_caught_up()),
      static_cast<long long>(resp->rows_copied_again()), resp->frozen_seconds(),
      static_cast<long long>(resp->pushes_kept()));
  return 0;
}

}  // namespace tessera::cli
