// tessera-cli restore.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_join.h"
#include "tools/cli/cli.h"
#include "wire/checkpoint_proto.h"

namespace tessera::cli {

namespace {

void PrintTableList(const char* what,
                    const google::protobuf::RepeatedPtrField<std::string>& names) {
  std::vector<std::string> sorted(names.begin(), names.end());
  std::sort(sorted.begin(), sorted.end(), NaturalLess);
  std::printf("  %s (%zu): %s\n", what, sorted.size(),
              sorted.empty() ? "none" : absl::StrJoin(sorted, ", ").c_str());
}

}  // namespace

// One model's checkpoint, or with --all_models every model's: a restore rolls tables back,
// so one without a model must say so.
int Restore(client::EmbeddingClient& tables, const std::string&) {
  const std::string model = absl::GetFlag(FLAGS_model);
  const bool all_models = absl::GetFlag(FLAGS_all_models);
  if (model.empty() == !all_models) {
    return Refuse(
        "restore needs --model=NAME (that model's tables only) or "
        "--all_models (every model of the cluster back to an operator's whole-cluster "
        "checkpoint), not both");
  }
  embedding::RestoreOptions options;
  options.model = model;
  options.all_models = all_models;
  absl::StatusOr<tessera::v1::RestoreResponse> restored =
      tables.RestoreTables(absl::GetFlag(FLAGS_step), options);
  if (!restored.ok()) return Fail("restore", restored.status());
  std::printf("restored: ");
  PrintCheckpoint(wire::FromProto(restored->checkpoint()));
  PrintTableList("rolled back", restored->rolled_back());
  PrintTableList("brought back", restored->brought_back());
  PrintTableList("dropped", restored->dropped());
  return 0;
}

}  // namespace tessera::cli
