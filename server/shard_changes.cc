// ShardService's change stream for serving replicas: ReadChanges answers the rows that
// changed after a replica's cursor, as they are now, of the rows this shard owns.
#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "embedding/sharding.h"
#include "server/shard_service.h"
#include "wire/row_chunk.h"

namespace tessera::server {

namespace {

constexpr size_t kDefaultChangeBytes = size_t{16} << 20;
constexpr size_t kMaxChangeBytes = size_t{64} << 20;  // a quarter of a message's limit

// The ids of `ids` that shard `index` of `num_shards` owns.
std::vector<int64_t> Owned(const v1::TableConfig& config, const std::vector<int64_t>& ids,
                           int32_t index, int32_t num_shards) {
  if (num_shards <= 1) return ids;
  std::vector<int64_t> owned;
  owned.reserve(ids.size());
  for (const int64_t id : ids) {
    if (embedding::ShardOfRow(config, id, num_shards) == index) owned.push_back(id);
  }
  return owned;
}

}  // namespace

grpc::Status ShardService::ReadChanges(grpc::ServerContext* context,
                                       const v1::ReadChangesRequest* request,
                                       v1::ReadChangesResponse* response) {
  return Serve(context, Access::kRead, [&]() -> absl::Status {
    const std::string& model = request->model();
    if (!model.empty()) TESSERA_RETURN_IF_ERROR(embedding::ValidateModelName(model));
    if (request->max_bytes() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_bytes must be >= 0, got ", request->max_bytes()));
    }
    // Its place as the rows are read: a row it no longer owns (moved by a reshard) is the
    // new owner's to send.
    const int32_t index = reshard_.index();
    const int32_t num_shards = reshard_.num_shards();
    response->set_shard_index(index);
    response->set_num_shards(num_shards);
    response->set_shard_map_version(reshard_.version());
    ChangeLog& log = pushes_.changes();
    if (!log.keeps()) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", index,
                       " keeps no change log (tessera-shard --change_log_bytes=0): serving "
                       "replicas cannot follow it"));
    }
    if (request->after().log() == 0) {
      const ChangeLog::Cursor head = log.Head();
      for (auto* c : {response->mutable_reached(), response->mutable_head()}) {
        c->set_log(head.log);
        c->set_sequence(head.sequence);
      }
      TESSERA_ASSIGN_OR_RETURN(ChangeLog::Changes none, log.Read(head, 0, nullptr));
      response->set_head_step(none.head_step);
      return absl::OkStatus();
    }
    const size_t budget = request->max_bytes() > 0
                              ? std::min(static_cast<size_t>(request->max_bytes()), kMaxChangeBytes)
                              : kDefaultChangeBytes;
    // A row's bytes per table, looked up once a read (the log holds many entries a table).
    std::map<std::string, size_t> row_bytes;
    auto cost = [&](const std::string& table) -> size_t {
      auto [it, added] = row_bytes.try_emplace(table, 0);
      if (added && embedding::TableOfModel(table, model)) {
        absl::StatusOr<v1::TableConfig> config = Config(table);
        if (config.ok()) it->second = sizeof(int64_t) + sizeof(float) * config->dim();
      }
      return it->second;
    };
    TESSERA_ASSIGN_OR_RETURN(
        ChangeLog::Changes changes,
        log.Read({request->after().log(), request->after().sequence()}, budget, cost));
    response->mutable_reached()->set_log(changes.reached.log);
    response->mutable_reached()->set_sequence(changes.reached.sequence);
    response->mutable_head()->set_log(changes.head.log);
    response->mutable_head()->set_sequence(changes.head.sequence);
    response->set_head_step(changes.head_step);
    for (const auto& [table, ids] : changes.ids) {
      absl::StatusOr<v1::TableConfig> config = Config(table);
      if (!config.ok()) continue;  // dropped since: its drop started another log
      const std::vector<int64_t> owned = Owned(*config, ids, index, num_shards);
      v1::TableChanges* out = response->add_tables();
      out->set_table(table);
      out->set_step(changes.steps[table]);
      if (owned.empty()) continue;
      embedding::ExportOptions options;
      options.ids = owned;
      options.chunk_rows = owned.size();
      TESSERA_RETURN_IF_ERROR(
          tables_->ExportRows(table, options, [&](const embedding::RowBlock& rows) {
            wire::ToChunk(rows, out->mutable_rows());
            return absl::OkStatus();
          }));
    }
    return absl::OkStatus();
  });
}

}  // namespace tessera::server
