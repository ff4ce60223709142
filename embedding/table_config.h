#ifndef TESSERA_EMBEDDING_TABLE_CONFIG_H_
#define TESSERA_EMBEDDING_TABLE_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "tessera/v1/config.pb.h"

namespace tessera::embedding {

// The largest TableConfig.vocabulary_size.
constexpr int64_t kMaxVocabularySize = int64_t{1} << 40;

// Checks a table config (name, dim, optimizer, initializer) and fills nothing in;
// InvalidArgument names the bad field.
absl::Status ValidateTableConfig(const v1::TableConfig& config);

// OK for a HOST table; FailedPrecondition for a DEVICE one, which a host collection, a
// shard or a coordinator does not hold (the trainer keeps those on its GPU).
absl::Status RequireHostPlacement(const v1::TableConfig& config);

// The fields in which `have` (a table as it exists) and `want` (what a caller asks for)
// differ, one entry each, as "optimizer.learning_rate 0.05 (the table's) vs 0.5": so that a
// refusal names the field and both values. Fields named in `ignored` (dotted paths such as
// "seed" or "optimizer.learning_rate") are not compared. An optional field that is unset
// reads "unset". Empty when they agree.
std::vector<std::string> TableConfigDifferences(const v1::TableConfig& have,
                                                const v1::TableConfig& want,
                                                absl::Span<const std::string> ignored = {});

// `config` with each optimizer field that `changes` sets put in (AlterTable): the type may
// be left unset and cannot change (the rows' state would not fit). InvalidArgument names
// another type or a value the optimizer refuses.
absl::StatusOr<v1::TableConfig> AlterOptimizer(const v1::TableConfig& config,
                                               const v1::OptimizerConfig& changes);

// A table's config as a server or a client holds it: never changed in place (a change
// makes a new one), so that two calls that find the same pointer find the same config.
using ConfigRef = std::shared_ptr<const v1::TableConfig>;

// A call's per-table configs kept by a thread for its next call: (*configs)[i] is a copy of
// (*held)[i], and a slot is copied again only when given another ConfigRef, as a config's
// copy allocates each of its parts. Code that sets `configs` otherwise clears `held`.
// Sizes both for `n` tables, keeping the slots in place.
void ResizeConfigSlots(size_t n, std::vector<v1::TableConfig>* configs,
                       std::vector<ConfigRef>* held);
// Slot i (of those sized) becomes `config`'s: copied only when it holds another.
void SetConfigSlot(size_t i, ConfigRef config, std::vector<v1::TableConfig>* configs,
                   std::vector<ConfigRef>* held);

}  // namespace tessera::embedding

#endif  // TESSERA_EMBEDDING_TABLE_CONFIG_H_
