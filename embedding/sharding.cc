#include "embedding/sharding.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tessera::embedding {

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
