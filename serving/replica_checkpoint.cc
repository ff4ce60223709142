// A replica of a checkpoint (tessera-serve --checkpoint): the rows the shards read from the
// checkpoint's files and the dense network it holds, served frozen.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "client/shard_router.h"
#include "serving/internal/replica_shard.h"
#include "serving/replica.h"
#include "trainer/dense_snapshot.h"
#include "wire/row_chunk.h"
#include "wire/security.h"

namespace tessera::serving {

namespace {

// Whether two shards' configs of one table give its rows alike: the rows' shape and the
// initial weights of the rows no checkpoint stores.
bool SameRows(const v1::TableConfig& a, const v1::TableConfig& b) {
  return a.dim() == b.dim() && a.seed() == b.seed() &&
         a.initializer().SerializeAsString() == b.initializer().SerializeAsString();
}

}  // namespace

absl::Status Replica::LoadCheckpoint(int64_t step) {
  embedding::RestoreOptions read;
  read.model = options_.model;
  read.verify_only = true;  // every shard reads it whole first; nothing changes
  TESSERA_ASSIGN_OR_RETURN(v1::RestoreResponse found, client_->RestoreTables(step, read));
  const v1::CheckpointInfo& info = found.checkpoint();
  const std::string which = embedding::CheckpointName(options_.model, info.step());
  if (info.dirs().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(which,
                     " does not record its shards' checkpoint directories (an older "
                     "coordinator took it): take a new checkpoint, or serve the live model"));
  }
  for (const std::string& t : options_.tables) {
    if (std::find(info.tables().begin(), info.tables().end(), t) == info.tables().end()) {
      return absl::NotFoundError(absl::StrCat(which, " holds no table '", t, "'"));
    }
  }
  const std::vector<std::string> dirs(info.dirs().begin(), info.dirs().end());
  TESSERA_RETURN_IF_ERROR(FollowMap());
  for (const std::string& name : info.tables()) {
    if (Wanted(name)) TESSERA_RETURN_IF_ERROR(LoadCheckpointTable(name, dirs));
  }
  auto dense = found.attachments().find(trainer::kServingAttachment);
  if (dense == found.attachments().end()) {
    Note(absl::StrCat(which,
                      " holds no dense network (an operator's checkpoint, or one taken before "
                      "tessera-train attached it): lookups only"));
  } else {
    absl::StatusOr<v1::DenseSnapshot> snapshot = trainer::ParseDenseSnapshot(dense->second);
    if (!snapshot.ok()) return Annotate(snapshot.status(), absl::StrCat(which, "'s dense network"));
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<const DenseModel> model, DenseModel::Make(*snapshot));
    absl::MutexLock lock(&mu_);
    dense_ = std::move(model);
  }
  frozen_step_ = info.step();
  {
    absl::MutexLock lock(&mu_);
    counters_.snapshots += static_cast<int64_t>(shards_.size());  // each read it whole
  }
  for (auto& [address, shard] : shards_) {
    shard->step = info.step() - 1;
    shard->head_step = info.step() - 1;
    shard->caught_up = true;
  }
  const ReplicaCounters done = counters();
  Note(absl::StrCat("serving ", which, " frozen: ", done.rows_applied, " rows read by ",
                    shards_.size(), " shard(s) from its files (", dirs.size(), " director",
                    dirs.size() == 1 ? "y" : "ies", ")"));
  return absl::OkStatus();
}

absl::Status Replica::LoadCheckpointTable(const std::string& name,
                                          const std::vector<std::string>& dirs) {
  std::shared_ptr<embedding::ServingTable> table;
  for (auto& [address, shard] : shards_) {
    v1::ExportRowsRequest request;
    request.set_table(name);
    request.set_since_step(-1);
    for (const std::string& dir : dirs) request.add_checkpoint_dirs(dir);
    std::unique_ptr<grpc::ClientContext> context =
        wire::NewCallContext(options_.client.security, options_.client.checkpoint_deadline);
    std::unique_ptr<grpc::ClientReader<v1::RowChunk>> reader =
        shard->stub->Get()->ExportRows(context.get(), request);
    v1::RowChunk chunk;
    absl::Status applied;
    while (applied.ok() && reader->Read(&chunk)) {
      if (chunk.has_config()) {
        if (table == nullptr) {
          absl::StatusOr<std::unique_ptr<embedding::ServingTable>> made =
              embedding::ServingTable::Create(chunk.config(), options_.format);
          if (!made.ok()) {
            applied = made.status();
            break;
          }
          table = std::move(*made);
        } else if (!SameRows(table->config(), chunk.config())) {
          applied = absl::DataLossError(absl::StrCat("the shards' checkpoints hold table '", name,
                                                     "' with different configs"));
          break;
        }
      }
      if (table == nullptr) {
        applied = absl::DataLossError(
            absl::StrCat("shard ", shard->index, " sent rows of '", name, "' before its config"));
        break;
      }
      absl::StatusOr<embedding::RowBlock> rows = wire::FromChunk(chunk);
      applied = rows.ok() ? table->Apply(rows->ids, rows->weights) : rows.status();
      if (!applied.ok()) break;
      absl::MutexLock lock(&mu_);
      counters_.rows_applied += static_cast<int64_t>(rows->size());
      counters_.bytes_read += static_cast<int64_t>(chunk.ByteSizeLong());
    }
    if (!applied.ok()) {
      context->TryCancel();
      (void)reader->Finish();
      return Annotate(applied, absl::StrCat("reading table '", name, "' of the checkpoint"));
    }
    const grpc::Status finished = reader->Finish();
    if (!finished.ok()) return client::FromShardStatus(finished, shard->index, shard->address);
  }
  if (table == nullptr)
    return absl::NotFoundError(absl::StrCat("no shard read table '", name, "'"));
  absl::MutexLock lock(&mu_);
  tables_[name] = std::move(table);
  return absl::OkStatus();
}

}  // namespace tessera::serving
