#ifndef TESSERA_TOOLS_CLI_TABLE_FLAGS_H_
#define TESSERA_TOOLS_CLI_TABLE_FLAGS_H_

// The table settings of tessera-cli's flags, which create and alter share.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/v1/embedding_service.pb.h"

namespace tessera::cli {

// The optimizer setting flags: "--lr", "--epsilon", ...
std::vector<const char*> OptimizerSettingFlags();

// The optimizer settings given as flags (--lr, --epsilon, ...), and only those: what
// `alter` changes, and what `create` sets beyond the defaults.
tessera::v1::OptimizerConfig OptimizerChanges();

// Refuses (false, saying why and what `type` takes) settings of `config` that `type` would
// ignore (beta1 for SGD).
bool SettingsTakeEffect(const char* command, const tessera::v1::OptimizerConfig& config,
                        tessera::v1::OptimizerType type);

// The TableConfig of `create`'s flags: every field, with tessera-train's defaults; the
// optimizer settings left out keep the servers' defaults.
absl::StatusOr<tessera::v1::TableConfig> CreateConfig(const std::string& table);

}  // namespace tessera::cli

#endif  // TESSERA_TOOLS_CLI_TABLE_FLAGS_H_
