// tessera-cli checkpoint, checkpoints, restore and reshard.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/channel_policy.h"
#include "grpcpp/grpcpp.h"
#include "tessera/v1/embedding_service.grpc.pb.h"
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

int TakeCheckpoint(client::EmbeddingClient& tables, const std::string&) {
  const int64_t step = absl::GetFlag(FLAGS_step);
  if (step < 0) {
    std::cerr << (step == -1 ? "tessera-cli: checkpoint needs --step (the training step it is "
                               "taken at)\n"
                             : absl::StrCat("tessera-cli: checkpoint --step must be >= 0, got ",
                                            step, "\n"));
    return 1;
  }
  embedding::CheckpointOptions options;
  options.model = absl::GetFlag(FLAGS_model);
  absl::StatusOr<embedding::CheckpointInfo> taken = tables.Checkpoint(step, {}, options);
  if (!taken.ok()) return Fail("checkpoint", taken.status());
  std::printf("checkpoint taken: ");
  PrintCheckpoint(*taken);
  return 0;
}

int Checkpoints(client::EmbeddingClient& tables, const std::string&) {
  absl::StatusOr<std::vector<embedding::CheckpointInfo>> listed = tables.ListCheckpoints();
  if (!listed.ok()) return Fail("checkpoints", listed.status());
  if (listed->empty()) std::printf("no complete checkpoints\n");
  for (const embedding::CheckpointInfo& c : *listed) PrintCheckpoint(c);
  return 0;
}

// One model's checkpoint, or with --all_models every model's: a restore rolls tables back,
// so one without a model must say so.
int Restore(Coordinator::Stub& stub) {
  const std::string model = absl::GetFlag(FLAGS_model);
  const bool all_models = absl::GetFlag(FLAGS_all_models);
  if (model.empty() == !all_models) {
    std::cerr << "tessera-cli: restore needs --model=NAME (that model's tables only) or "
                 "--all_models (every model of the cluster back to an operator's whole-cluster "
                 "checkpoint), not both\n";
    return 1;
  }
  tessera::v1::RestoreRequest req;
  req.set_step(absl::GetFlag(FLAGS_step));
  req.set_model(model);
  req.set_all_models(all_models);
  auto ctx = Context(kCheckpointDeadlineMs);
  tessera::v1::RestoreResponse resp;
  grpc::Status s = stub.Restore(ctx.get(), req, &resp);
  if (!s.ok()) return Fail("restore", s);
  std::printf("restored: ");
  PrintCheckpoint(wire::FromProto(resp.checkpoint()));
  PrintTableList("rolled back", resp.rolled_back());
  PrintTableList("brought back", resp.brought_back());
  PrintTableList("dropped", resp.dropped());
  return 0;
}

// Moves the cluster to the shards of --shards while it trains on.
int Reshard(Coordinator::Stub& stub) {
  const std::vector<std::string> shards =
      absl::StrSplit(absl::GetFlag(FLAGS_shards), ',', absl::SkipEmpty());
  if (shards.empty()) {
    std::cerr << "tessera-cli: reshard needs --shards=host:port,... (the new map's shards, in "
                 "shard order)\n";
    return 1;
  }
  tessera::v1::ReshardClusterRequest req;
  for (const std::string& a : shards) req.add_shards(a);
  auto ctx = Context(kCheckpointDeadlineMs);
  tessera::v1::ReshardClusterResponse resp;
  grpc::Status s = stub.Reshard(ctx.get(), req, &resp);
  if (!s.ok()) return Fail("reshard", s);
  std::printf(
      "resharded: %zu shards, shard map version %llu; %lld rows moved in %.1f s (rows "
      "updated meanwhile copied again: %lld while serving, %lld while pushes waited "
      "%.2f s), %lld applied pushes handed over\n",
      shards.size(), static_cast<unsigned long long>(resp.version()),
      static_cast<long long>(resp.rows_moved()), resp.seconds(),
      static_cast<long long>(resp.rows_caught_up()),
      static_cast<long long>(resp.rows_copied_again()), resp.frozen_seconds(),
      static_cast<long long>(resp.pushes_kept()));
  return 0;
}

}  // namespace tessera::cli
