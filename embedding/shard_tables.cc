#include "embedding/shard_tables.h"

namespace tessera::embedding {

absl::Status ShardTables::PushGradientsRecorded(absl::string_view table,
                                                absl::Span<const int64_t> ids,
                                                absl::Span<const float> gradients, int64_t step,
                                                const PushTag&) {
  return PushGradients(table, ids, gradients, step);
}

std::optional<int64_t> ShardTables::RecordedPush(const PushTag&) const { return std::nullopt; }

}  // namespace tessera::embedding
