#include "embedding/sharding.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tessera::embedding {

int32_t ShardOfRow(const v1::TableConfig& config, int64_t id, int32_t num_shards, int32_t outer) {
  if (config.vocabulary_size() == 0) return ShardOf(id, config.seed(), num_shards);
  return static_cast<int32_t>(static_cast<uint64_t>(id) / static_cast<uint64_t>(outer) %
                              static_cast<uint64_t>(num_shards));
}

bool OwnsAll(const v1::TableConfig& config, absl::Span<const int64_t> ids, int32_t shard_index,
             int32_t num_shards) {
  return std::all_of(ids.begin(), ids.end(),
                     [&](int64_t id) { return ShardOfRow(config, id, num_shards) == shard_index; });
}

absl::Status CheckVocabulary(const v1::TableConfig& config, absl::Span<const int64_t> ids) {
  const int64_t n = config.vocabulary_size();
  if (n == 0) return absl::OkStatus();
  for (const int64_t id : ids) {
    if (id < 0 || id >= n) {
      return absl::InvalidArgumentError(absl::StrCat("table '", config.name(), "': id ", id,
                                                     " is outside its vocabulary [0, ", n, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::embedding
