// tessera-cli shardmap.
#include <cstdio>
#include <string>

#include "tools/cli/cli.h"

namespace tessera::cli {

int PrintShardMap(client::EmbeddingClient& tables, const std::string&) {
  absl::StatusOr<tessera::v1::ShardMap> map = tables.ShardMap();
  if (!map.ok()) return Fail("shardmap", map.status());
  std::printf("version %llu\n", static_cast<unsigned long long>(map->version()));
  for (const auto& sh : map->shards()) {
    std::printf("shard %d  %s  %s\n", sh.index(), sh.address().c_str(),
                sh.serving() ? "serving" : "DOWN");
  }
  return 0;
}

}  // namespace tessera::cli
