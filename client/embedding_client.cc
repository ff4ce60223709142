#include "client/embedding_client.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "embedding/batch_ops.h"
#include "grpcpp/grpcpp.h"
#include "wire/checkpoint_proto.h"
#include "wire/grpc_status.h"
#include "wire/packed_bytes.h"
#include "wire/push_proto.h"
#include "wire/row_chunk.h"

namespace tessera::client {
absl::StatusOr<std::unique_ptr<EmbeddingClient>> EmbeddingClient::Connect(
    const std::string& address, const ClientOptions& options) {
  grpc::ChannelArguments args = ChannelArgs(options.max_message_bytes);
  auto credentials = wire::MakeChannelCredentials(options.security, &args);
  auto channel = grpc::CreateCustomChannel(address, credentials, args);
  if (options.wait_for_coordinator &&
      !channel->WaitForConnected(std::chrono::system_clock::now() + options.deadline)) {
    return wire::ExplainCoordinatorFailure(
        absl::UnavailableError(absl::StrCat("coordinator ", address, " not reachable within ",
                                            options.deadline.count(), " ms")),
        address, options.security);
  }
  std::unique_ptr<EmbeddingClient> c(
      new EmbeddingClient(address, args, std::move(credentials), options));
  TESSERA_RETURN_IF_ERROR(
      wire::ExplainCoordinatorFailure(c->RefreshShardMap(), address, options.security));
  return c;
}

EmbeddingClient::EmbeddingClient(const std::string& address, grpc::ChannelArguments args,
                                 std::shared_ptr<grpc::ChannelCredentials> credentials,
                                 const ClientOptions& options)
    : options_(options),
      coordinator_(address, std::move(args), std::move(credentials)),
      client_id_(embedding::RandomNonZeroId()) {}

std::unique_ptr<grpc::ClientContext> EmbeddingClient::NewContext(
    std::chrono::milliseconds deadline) const {
  return wire::NewCallContext(options_.security, deadline);
}

absl::Status EmbeddingClient::WithRetries(const std::function<absl::Status()>& call) const {
  for (int attempt = 0;; ++attempt) {
    absl::Status s = call();
    if (!RetryCanFix(static_cast<grpc::StatusCode>(s.code())) ||
        attempt >= options_.retry.max_retries) {
      return s;
    }
    std::this_thread::sleep_for(options_.retry.Backoff(attempt));
    // A channel whose server was down may sit in failure without dialling again.
    coordinator_.Reset();
    std::shared_ptr<ShardRouter> router;
    {
      absl::ReaderMutexLock lock(&mu_);
      router = router_;
    }
    if (router != nullptr) router->Reconnect();
  }
}

absl::Status EmbeddingClient::RefreshShardMap() {
  TESSERA_ASSIGN_OR_RETURN(v1::ShardMap map, ShardMap());
  std::vector<std::string> addresses;
  for (const auto& s : map.shards()) addresses.push_back(s.address());
  absl::MutexLock lock(&mu_);
  num_shards_ = map.shards_size();
  if (options_.mode == ClientOptions::Mode::kSmart) {
    RouterOptions ro;
    ro.deadline = options_.deadline;
    ro.max_message_bytes = options_.max_message_bytes;
    ro.shard_map_version = map.version();
    ro.security = options_.security;
    ro.retry = options_.retry;
    ro.pool = options_.pool;
    if (router_ != nullptr) retired_router_restarts_ += router_->restarts();
    router_ = std::make_shared<ShardRouter>(addresses, ro);
    router_->SetRestartCallback([this](int) { ReprovisionThroughCoordinator(); });
  }
  return absl::OkStatus();
}

void EmbeddingClient::ReprovisionThroughCoordinator() {
  v1::ListTablesResponse tables;
  absl::Status s =
      wire::FromGrpcStatus(coordinator_.Get()->ListTables(NewContext().get(), {}, &tables));
  // The same config again is OK at the coordinator, which creates the table on the shards
  // that lack it.
  for (int i = 0; s.ok() && i < tables.tables_size(); ++i) {
    v1::CreateTableRequest req;
    *req.mutable_config() = tables.tables(i);
    v1::CreateTableResponse resp;
    s = Annotate(
        wire::FromGrpcStatus(coordinator_.Get()->CreateTable(NewContext().get(), req, &resp)),
        absl::StrCat("table '", tables.tables(i).name(), "'"));
  }
  if (!s.ok()) {
    std::fprintf(stderr, "tessera: a restarted shard's tables could not be made again: %s\n",
                 s.ToString().c_str());
  }
}

absl::Status EmbeddingClient::OnShards(const std::function<absl::Status(ShardRouter&)>& call) {
  for (int attempt = 0;; ++attempt) {
    std::shared_ptr<ShardRouter> router;
    {
      absl::ReaderMutexLock lock(&mu_);
      router = router_;
    }
    absl::Status s = call(*router);
    // A stale shard map: fetch the new one and try again (while the map keeps changing:
    // a reshard's shards take the new map's requests once they commit).
    if (s.code() != absl::StatusCode::kFailedPrecondition || attempt > 3) return s;
    const uint64_t was = router->shard_map_version();
    TESSERA_RETURN_IF_ERROR(RefreshShardMap());
    {
      absl::ReaderMutexLock lock(&mu_);
      if (attempt > 0 && router_->shard_map_version() == was) return s;
    }
  }
}

absl::Status EmbeddingClient::CreateTable(const v1::TableConfig& config) {
  v1::CreateTableRequest req;
  *req.mutable_config() = config;
  v1::CreateTableResponse resp;
  TESSERA_RETURN_IF_ERROR(CallCoordinator(&v1::Coordinator::Stub::CreateTable, req, &resp));
  absl::MutexLock lock(&mu_);
  configs_[config.name()] = std::make_shared<const v1::TableConfig>(config);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::TableConfig>> EmbeddingClient::ListTables() const {
  v1::ListTablesResponse resp;
  TESSERA_RETURN_IF_ERROR(
      CallCoordinator(&v1::Coordinator::Stub::ListTables, v1::ListTablesRequest(), &resp));
  std::vector<v1::TableConfig> out(resp.tables().begin(), resp.tables().end());
  absl::MutexLock lock(&mu_);
  for (const auto& t : out) configs_[t.name()] = std::make_shared<const v1::TableConfig>(t);
  return out;
}

absl::StatusOr<std::shared_ptr<const v1::TableConfig>> EmbeddingClient::ConfigOf(
    absl::string_view table) const {
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = configs_.find(table);
    if (it != configs_.end()) return it->second;
  }
  TESSERA_RETURN_IF_ERROR(ListTables().status());
  absl::ReaderMutexLock lock(&mu_);
  auto it = configs_.find(table);
  if (it == configs_.end()) {
    return absl::NotFoundError(absl::StrCat("table '", table, "' not found"));
  }
  return it->second;
}

absl::StatusOr<v1::TableConfig> EmbeddingClient::Config(absl::string_view table) const {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<const v1::TableConfig> config, ConfigOf(table));
  return *config;
}

template <typename Part>
absl::StatusOr<absl::Span<const v1::TableConfig>> EmbeddingClient::Configs(
    absl::Span<const Part> tables, ConfigSlots* slots) const {
  embedding::ResizeConfigSlots(tables.size(), &slots->configs, &slots->held);
  for (size_t i = 0; i < tables.size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(embedding::ConfigRef c, ConfigOf(tables[i].table));
    embedding::SetConfigSlot(i, std::move(c), &slots->configs, &slots->held);
  }
  return absl::MakeConstSpan(slots->configs);
}

embedding::RequestId EmbeddingClient::NextRequestId() {
  return {client_id_, next_sequence_.fetch_add(1)};
}

absl::Status EmbeddingClient::Lookup(absl::string_view table, absl::Span<const int64_t> ids,
                                     absl::Span<float> out,
                                     const embedding::LookupOptions& options) {
  embedding::TableBags part;
  part.table = std::string(table);
  part.ids = ids;
  part.out = out;
  return LookupBatch({&part, 1}, options);
}

absl::Status EmbeddingClient::PooledLookup(absl::string_view table, absl::Span<const int64_t> ids,
                                           absl::Span<const int32_t> offsets,
                                           absl::Span<const float> weights, v1::Pooling pooling,
                                           absl::Span<float> out,
                                           const embedding::LookupOptions& options) {
  if (offsets.empty()) {  // empty offsets would read as a lookup without bags
    return Annotate(embedding::ValidateBags(ids.size(), offsets, weights.size()),
                    absl::StrCat("table '", table, "'"));
  }
  embedding::TableBags part{std::string(table), ids, offsets, weights, pooling, out};
  return LookupBatch({&part, 1}, options);
}

absl::StatusOr<absl::Span<const v1::TableConfig>> EmbeddingClient::CheckedLookups(
    absl::Span<const embedding::TableBags> tables, ConfigSlots* slots) const {
  TESSERA_ASSIGN_OR_RETURN(absl::Span<const v1::TableConfig> configs, Configs(tables, slots));
  for (size_t i = 0; i < tables.size(); ++i) {
    const embedding::TableBags& t = tables[i];
    TESSERA_ASSIGN_OR_RETURN(const size_t rows,
                             embedding::CheckLookupShape(absl::StrCat("table '", t.table, "'"),
                                                         t.ids.size(), t.offsets, t.weights));
    TESSERA_RETURN_IF_ERROR(embedding::CheckRowsSize(t.table, "output", t.out.size(), rows,
                                                     configs[i].dim(),
                                                     t.offsets.empty() ? "ids" : "bags"));
  }
  return configs;
}

namespace {

// The coordinator's request for a lookup of `tables`.
void FillLookupRequest(absl::Span<const embedding::TableBags> tables, bool insert_missing,
                       v1::BatchLookupRequest* req) {
  req->Clear();
  req->set_read_only(!insert_missing);
  // The coordinator forwards its shards' answers; they are merged here (MergeForwarded).
  req->set_shard_rows(true);
  for (const embedding::TableBags& t : tables) {
    v1::TableLookup* part = req->add_tables();
    part->set_table(t.table);
    part->set_pooling(t.pooling);
    wire::SetPacked(t.ids, part->mutable_ids());
    wire::SetPacked(t.offsets, part->mutable_offsets());
    wire::SetPacked(t.weights, part->mutable_weights());
  }
}

// A table's answer forwarded from its shards (TableValues.shard_values) merged into
// part.out as the router merges its shards' answers: the same floats, in the same order.
absl::Status MergeForwarded(const v1::TableValues& answer, const embedding::TableBags& part) {
  const int dim = answer.dim();
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  auto broken = [&](const std::string& why) {
    return absl::InternalError(
        absl::StrCat("table '", part.table, "': coordinator's forwarded answer ", why));
  };
  if (dim <= 0 || static_cast<size_t>(answer.rows()) * dim != part.out.size()) {
    return broken(absl::StrCat("is ", answer.rows(), " rows of dim ", dim, ", expected ",
                               part.out.size(), " floats"));
  }
  if (answer.shard_pooled()) {
    if (part.offsets.empty()) return broken("pools bags the request did not have");
    std::vector<const char*> partials;
    for (const std::string& block : answer.shard_values()) {
      if (block.size() != part.out.size() * sizeof(float)) return broken("has a short block");
      partials.push_back(block.data());
    }
    embedding::AddPartialBags(partials, dim, part.offsets, part.pooling, part.out.data());
    return absl::OkStatus();
  }
  thread_local std::vector<float> rows;
  thread_local std::vector<int32_t> row_of;
  size_t total = 0;
  for (const std::string& block : answer.shard_values()) {
    if (block.size() % row_bytes != 0) return broken("has a block of part of a row");
    total += block.size();
  }
  rows.resize(total / sizeof(float));
  char* at = reinterpret_cast<char*>(rows.data());
  for (const std::string& block : answer.shard_values()) {
    std::memcpy(at, block.data(), block.size());
    at += block.size();
  }
  if (answer.row_of_ids().size() != part.ids.size() * sizeof(int32_t)) {
    return broken("does not give every id its row");
  }
  row_of.resize(part.ids.size());
  std::memcpy(row_of.data(), answer.row_of_ids().data(), answer.row_of_ids().size());
  const int64_t num_rows = static_cast<int64_t>(total / row_bytes);
  for (const int32_t r : row_of) {
    if (r < 0 || r >= num_rows) return broken("names a row it does not hold");
  }
  embedding::RowsToAnswer(rows.data(), dim, row_of, part.offsets, part.weights, part.pooling,
                          part.out.data());
  return absl::OkStatus();
}

// The coordinator's answer to a lookup of `tables`, copied or merged into their `out`.
absl::Status CopyLookupAnswer(const v1::BatchLookupResponse& resp,
                              absl::Span<const embedding::TableBags> tables) {
  if (resp.tables_size() != static_cast<int>(tables.size())) {
    return absl::InternalError(absl::StrCat("coordinator answered ", resp.tables_size(),
                                            " tables, expected ", tables.size()));
  }
  for (size_t i = 0; i < tables.size(); ++i) {
    if (resp.tables(i).values().empty() && !tables[i].out.empty()) {
      TESSERA_RETURN_IF_ERROR(MergeForwarded(resp.tables(i), tables[i]));
      continue;
    }
    const std::string& values = resp.tables(i).values();
    if (values.size() != tables[i].out.size() * sizeof(float)) {
      return absl::InternalError(absl::StrCat("table '", tables[i].table,
                                              "': coordinator returned ", values.size() / 4,
                                              " floats, expected ", tables[i].out.size()));
    }
    std::memcpy(tables[i].out.data(), values.data(), values.size());
  }
  return absl::OkStatus();
}

// The coordinator's request for a push of `tables` under request id `id`.
void FillPushRequest(absl::Span<const embedding::TableGradients> tables, int64_t step,
                     const embedding::RequestId& id, const embedding::PushOptions& options,
                     v1::BatchPushRequest* req) {
  req->set_step(step);
  wire::ToProto(id, req->mutable_request_id());
  if (options.sync.active()) wire::ToProto(options.sync, req->mutable_sync());
  req->set_after_lookup(options.after_lookup);
  for (const embedding::TableGradients& t : tables) {
    v1::TableGradients* part = req->add_tables();
    part->set_table(t.table);
    wire::SetPacked(t.ids, part->mutable_ids());
    wire::SetPacked(t.gradients, part->mutable_gradients());
  }
}

void SetRowsUpdated(const v1::BatchPushResponse& resp, const embedding::PushOptions& options) {
  if (options.rows_updated != nullptr) {
    options.rows_updated->assign(resp.rows_updated().begin(), resp.rows_updated().end());
  }
}

}  // namespace

absl::Status EmbeddingClient::LookupBatch(absl::Span<const embedding::TableBags> tables,
                                          const embedding::LookupOptions& options) {
  thread_local ConfigSlots slots;
  TESSERA_ASSIGN_OR_RETURN(absl::Span<const v1::TableConfig> configs,
                           CheckedLookups(tables, &slots));
  if (options_.mode == ClientOptions::Mode::kSmart) {
    return OnShards([&](ShardRouter& router) {
      return router.LookupBatch(configs, tables, !options.insert_missing);
    });
  }
  auto messages = lookup_messages_.Acquire();
  v1::BatchLookupRequest& req = messages->request;
  v1::BatchLookupResponse& resp = messages->response;
  FillLookupRequest(tables, options.insert_missing, &req);
  return WithRetries([&] {
    auto ctx = NewContext();
    TESSERA_RETURN_IF_ERROR(
        wire::FromGrpcStatus(coordinator_.Get()->BatchLookup(ctx.get(), req, &resp)));
    NoteCoordinatorDigest(resp.incarnation(), resp.shard_map_version());
    return CopyLookupAnswer(resp, tables);
  });
}

absl::Status EmbeddingClient::PushThenLookup(absl::Span<const embedding::TableGradients> push,
                                             int64_t step, const embedding::PushOptions& pushing,
                                             absl::Span<const embedding::TableBags> lookups,
                                             const embedding::LookupOptions& options) {
  if (push.empty() || pushing.check_only || pushing.sync.active()) {
    // A check round or a sync group's push does not ride on a lookup: two calls.
    return EmbeddingCollection::PushThenLookup(push, step, pushing, lookups, options);
  }
  thread_local ConfigSlots lookup_slots;
  thread_local ConfigSlots push_slots;
  TESSERA_ASSIGN_OR_RETURN(absl::Span<const v1::TableConfig> configs,
                           CheckedLookups(lookups, &lookup_slots));
  TESSERA_ASSIGN_OR_RETURN(absl::Span<const v1::TableConfig> push_configs,
                           Configs(push, &push_slots));
  TESSERA_ASSIGN_OR_RETURN(const embedding::CheckedPush checked,
                           embedding::CheckPush(push_configs, push));
  const embedding::RequestId id = pushing.request_id.empty() ? NextRequestId() : pushing.request_id;
  if (options_.mode == ClientOptions::Mode::kSmart) {
    return OnShards([&](ShardRouter& router) -> absl::Status {
      TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> updated,
                               router.PushThenLookup(checked, step, id, pushing.after_lookup,
                                                     configs, lookups, !options.insert_missing));
      if (pushing.rows_updated != nullptr) *pushing.rows_updated = std::move(updated);
      return absl::OkStatus();
    });
  }
  auto messages = lookup_messages_.Acquire();
  v1::BatchLookupRequest& req = messages->request;
  v1::BatchLookupResponse& resp = messages->response;
  FillLookupRequest(lookups, options.insert_missing, &req);
  FillPushRequest(push, step, id, pushing, req.mutable_push());
  // Every attempt carries the push's one request id: a repeat applies it once.
  return WithRetries([&] {
    auto ctx = NewContext();
    TESSERA_RETURN_IF_ERROR(
        wire::FromGrpcStatus(coordinator_.Get()->BatchLookup(ctx.get(), req, &resp)));
    NoteCoordinatorDigest(resp.incarnation(), resp.shard_map_version());
    if (!resp.has_push()) {
      return absl::InternalError(
          "the coordinator answered a lookup carrying a push without the push's answer (an "
          "older tessera-coordinator?)");
    }
    SetRowsUpdated(resp.push(), pushing);
    return CopyLookupAnswer(resp, lookups);
  });
}

absl::Status EmbeddingClient::PushGradients(absl::string_view table, absl::Span<const int64_t> ids,
                                            absl::Span<const float> gradients, int64_t step) {
  embedding::TableGradients part{std::string(table), ids, gradients};
  return PushBatch({&part, 1}, step, {});
}

absl::Status EmbeddingClient::PushBatch(absl::Span<const embedding::TableGradients> tables,
                                        int64_t step, const embedding::PushOptions& options) {
  if (options.check_only) {
    return absl::UnimplementedError(
        "a remote collection does not check a push apart: its pushes check every shard's "
        "part before any applies");
  }
  thread_local ConfigSlots slots;
  TESSERA_ASSIGN_OR_RETURN(absl::Span<const v1::TableConfig> configs, Configs(tables, &slots));
  // The one check of the push's values in this process (the servers check it again in theirs).
  TESSERA_ASSIGN_OR_RETURN(const embedding::CheckedPush checked,
                           embedding::CheckPush(configs, tables));
  // One id for every attempt of this push, whichever shards or hops repeat it.
  const embedding::RequestId id = options.request_id.empty() ? NextRequestId() : options.request_id;
  // A sync group's push is ABORTED by a shard only for the step's workers (one did not push
  // in time, or pushed again): the cause is a data-parallel partner, not a server.
  auto caused = [&options](absl::Status s) {
    return options.sync.active() && absl::IsAborted(s) ? WithCause(std::move(s), Cause::kWorker)
                                                       : s;
  };
  if (options_.mode == ClientOptions::Mode::kSmart) {
    return caused(OnShards([&](ShardRouter& router) -> absl::Status {
      TESSERA_ASSIGN_OR_RETURN(
          std::vector<int64_t> updated,
          router.PushBatch(checked, step, id, options.sync, options.after_lookup));
      if (options.rows_updated != nullptr) *options.rows_updated = std::move(updated);
      return absl::OkStatus();
    }));
  }
  v1::BatchPushRequest req;
  FillPushRequest(tables, step, id, options, &req);
  const std::chrono::milliseconds deadline =
      options.sync.active() ? wire::SyncDeadline(options.sync, options_.deadline)
                            : options_.deadline;
  auto push = [&] {
    auto ctx = NewContext(deadline);
    v1::BatchPushResponse resp;
    TESSERA_RETURN_IF_ERROR(
        wire::FromGrpcStatus(coordinator_.Get()->BatchPush(ctx.get(), req, &resp)));
    NoteCoordinatorDigest(resp.incarnation(), resp.shard_map_version());
    SetRowsUpdated(resp, options);
    return absl::OkStatus();
  };
  if (!options.sync.active()) return WithRetries(push);
  // A job's group is registered before its first push; refused FAILED_PRECONDITION (the
  // coordinator restarted and lost it), it is registered again and the push sent again
  // under the same request id (a refusal with another cause comes back again).
  TESSERA_RETURN_IF_ERROR(RegisterSyncGroup(options.sync, /*again=*/false));
  absl::Status pushed = WithRetries(push);
  if (absl::IsFailedPrecondition(pushed) && RegisterSyncGroup(options.sync, /*again=*/true).ok()) {
    pushed = WithRetries(push);
  }
  return caused(std::move(pushed));
}

absl::Status EmbeddingClient::RegisterSyncGroup(const embedding::PushSync& sync, bool again) {
  {
    absl::MutexLock lock(&mu_);
    auto it = sync_groups_.find(sync.job);
    if (!again && it != sync_groups_.end() && it->second == sync.workers) return absl::OkStatus();
  }
  v1::RegisterSyncGroupRequest req;
  req.mutable_group()->set_job(sync.job);
  req.mutable_group()->set_workers(sync.workers);
  v1::RegisterSyncGroupResponse resp;
  TESSERA_RETURN_IF_ERROR(CallCoordinator(&v1::Coordinator::Stub::RegisterSyncGroup, req, &resp));
  absl::MutexLock lock(&mu_);
  sync_groups_[sync.job] = sync.workers;
  return absl::OkStatus();
}

absl::StatusOr<embedding::TableUsage> EmbeddingClient::Usage(absl::string_view table) const {
  TESSERA_ASSIGN_OR_RETURN(v1::StatsResponse resp, Stats(table));
  embedding::TableUsage usage;
  for (const auto& t : resp.tables()) {
    usage.rows += t.rows();
    usage.memory_bytes += t.memory_bytes();
  }
  return usage;
}

void EmbeddingClient::NoteCoordinatorDigest(uint64_t digest, uint64_t map_version) {
  if (digest == 0) return;  // the coordinator has not heard from every shard yet
  const uint64_t before = digest_.exchange(digest);
  // A digest of another map's shards (a reshard) is a new baseline, not a restart.
  if (map_version_.exchange(map_version) != map_version) return;
  if (before != 0 && before != digest) coordinator_restarts_.fetch_add(1);
}

int64_t EmbeddingClient::ShardRestarts() const {
  absl::ReaderMutexLock lock(&mu_);
  return coordinator_restarts_.load() + retired_router_restarts_ +
         (router_ != nullptr ? router_->restarts() : 0);
}

int EmbeddingClient::num_shards() const {
  absl::ReaderMutexLock lock(&mu_);
  return num_shards_;
}

absl::Status EmbeddingClient::ExportRows(
    absl::string_view table, const embedding::ExportOptions& options,
    const std::function<absl::Status(const embedding::RowBlock&)>& sink) {
  v1::ExportRowsRequest req;
  req.set_table(std::string(table));
  req.set_since_step(options.since_step);
  req.set_with_state(options.with_state);
  req.set_chunk_rows(static_cast<int32_t>(std::min<size_t>(options.chunk_rows, 1 << 24)));
  auto ctx = NewContext(options_.checkpoint_deadline);
  auto reader = coordinator_.Get()->ExportRows(ctx.get(), req);
  v1::RowChunk chunk;
  absl::Status sunk;
  while (sunk.ok() && reader->Read(&chunk)) {
    absl::StatusOr<embedding::RowBlock> block = wire::FromChunk(chunk);
    sunk = block.ok() ? sink(*block) : block.status();
  }
  if (!sunk.ok()) {
    ctx->TryCancel();
    (void)reader->Finish();
    return sunk;
  }
  return wire::FromGrpcStatus(reader->Finish());
}

absl::Status EmbeddingClient::ImportRows(absl::string_view table, const embedding::RowBlock& rows) {
  v1::ImportRowsRequest req;
  req.set_table(std::string(table));
  wire::ToChunk(rows, req.mutable_rows());
  v1::ImportRowsResponse resp;  // an import sets rows: repeating it stores the same
  return CallCoordinator(&v1::Coordinator::Stub::ImportRows, req, &resp);
}

absl::StatusOr<v1::TableConfig> EmbeddingClient::AlterTable(absl::string_view table,
                                                            const v1::OptimizerConfig& changes) {
  v1::AlterTableRequest req;
  req.set_table(std::string(table));
  *req.mutable_optimizer() = changes;
  v1::AlterTableResponse resp;
  // The same change again is OK.
  TESSERA_RETURN_IF_ERROR(CallCoordinator(&v1::Coordinator::Stub::AlterTable, req, &resp));
  absl::MutexLock lock(&mu_);
  configs_.erase(std::string(table));  // cached configs are looked up again
  return resp.config();
}

absl::Status EmbeddingClient::DropTable(absl::string_view table) {
  v1::DropTableRequest req;
  req.set_table(std::string(table));
  int attempts = 0;
  absl::Status s = WithRetries([&] {
    ++attempts;
    v1::DropTableResponse resp;
    auto ctx = NewContext();
    return wire::FromGrpcStatus(coordinator_.Get()->DropTable(ctx.get(), req, &resp));
  });
  // A retry of a drop whose answer was lost finds the table gone: that is the drop done.
  if (absl::IsNotFound(s) && attempts > 1) return absl::OkStatus();
  return s;
}

absl::StatusOr<embedding::CheckpointInfo> EmbeddingClient::Checkpoint(
    int64_t step, const embedding::Attachments& attachments,
    const embedding::CheckpointOptions& options) {
  v1::CheckpointRequest req;
  req.set_step(step);
  req.set_model(options.model);
  req.set_replace(options.replace);
  for (const auto& [name, blob] : attachments) (*req.mutable_attachments())[name] = blob;
  v1::CheckpointResponse resp;
  int attempts = 0;
  // Retried: the caller is at a step barrier. A retry of one that completed but whose
  // answer was lost is ALREADY_EXISTS: the checkpoint is there, so it is the answer.
  absl::Status s = WithRetries([&] {
    ++attempts;
    auto ctx = NewContext(options_.checkpoint_deadline);
    return wire::FromGrpcStatus(coordinator_.Get()->Checkpoint(ctx.get(), req, &resp));
  });
  if (absl::IsAlreadyExists(s) && attempts > 1) {
    TESSERA_ASSIGN_OR_RETURN(std::vector<embedding::CheckpointInfo> all, ListCheckpoints());
    for (const auto& c : all) {
      if (c.model == options.model && c.step == step) return c;
    }
  }
  TESSERA_RETURN_IF_ERROR(s);
  return wire::FromProto(resp.checkpoint());
}

absl::StatusOr<v1::RestoreResponse> EmbeddingClient::RestoreTables(
    int64_t step, const embedding::RestoreOptions& options) {
  v1::RestoreRequest req;
  req.set_step(step);
  wire::ToProto(options, &req);
  v1::RestoreResponse resp;  // restoring a step twice gives the same state
  TESSERA_RETURN_IF_ERROR(
      CallCoordinator(&v1::Coordinator::Stub::Restore, req, &resp, options_.checkpoint_deadline));
  return resp;
}

absl::StatusOr<embedding::CheckpointInfo> EmbeddingClient::Restore(
    int64_t step, embedding::Attachments* attachments, const embedding::RestoreOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(v1::RestoreResponse resp, RestoreTables(step, options));
  if (attachments != nullptr) {
    attachments->clear();
    for (const auto& [name, blob] : resp.attachments()) (*attachments)[name] = blob;
  }
  return wire::FromProto(resp.checkpoint());
}

absl::StatusOr<std::vector<embedding::CheckpointInfo>> EmbeddingClient::ListCheckpoints() const {
  v1::ListCheckpointsResponse resp;
  TESSERA_RETURN_IF_ERROR(CallCoordinator(&v1::Coordinator::Stub::ListCheckpoints,
                                          v1::ListCheckpointsRequest(), &resp));
  std::vector<embedding::CheckpointInfo> out;
  for (const auto& c : resp.checkpoints()) out.push_back(wire::FromProto(c));
  return out;
}

absl::Status EmbeddingClient::StoreSet(const std::string& key, const std::string& value) {
  v1::StoreSetRequest req;
  req.set_key(key);
  req.set_value(value);
  v1::StoreSetResponse resp;
  return CallCoordinator(&v1::Coordinator::Stub::StoreSet, req, &resp);
}

absl::StatusOr<std::vector<std::string>> EmbeddingClient::StoreGet(
    const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  v1::StoreGetRequest req;
  for (const auto& k : keys) req.add_keys(k);
  req.set_timeout_ms(static_cast<int32_t>(
      std::clamp<int64_t>(timeout.count(), 0, std::numeric_limits<int32_t>::max())));
  v1::StoreGetResponse resp;
  // The coordinator waits up to `timeout` for the keys: the call may take that long.
  TESSERA_RETURN_IF_ERROR(
      CallCoordinator(&v1::Coordinator::Stub::StoreGet, req, &resp, timeout + options_.deadline));
  if (resp.values_size() != static_cast<int>(keys.size())) {
    return absl::InternalError(absl::StrCat("coordinator answered ", resp.values_size(),
                                            " values for ", keys.size(), " keys"));
  }
  return std::vector<std::string>(resp.values().begin(), resp.values().end());
}

absl::StatusOr<v1::StatsResponse> EmbeddingClient::Stats(absl::string_view table) const {
  v1::StatsRequest req;
  req.set_table(std::string(table));
  v1::StatsResponse resp;
  TESSERA_RETURN_IF_ERROR(CallCoordinator(&v1::Coordinator::Stub::Stats, req, &resp));
  return resp;
}

absl::StatusOr<v1::ShardMap> EmbeddingClient::ShardMap() const {
  v1::ShardMap map;
  TESSERA_RETURN_IF_ERROR(
      CallCoordinator(&v1::Coordinator::Stub::GetShardMap, v1::GetShardMapRequest(), &map));
  return map;
}

absl::StatusOr<v1::ReshardClusterResponse> EmbeddingClient::Reshard(
    const std::vector<std::string>& shards) {
  v1::ReshardClusterRequest req;
  for (const std::string& a : shards) req.add_shards(a);
  v1::ReshardClusterResponse resp;
  auto ctx = NewContext(options_.checkpoint_deadline);
  TESSERA_RETURN_IF_ERROR(wire::FromGrpcStatus(coordinator_.Get()->Reshard(ctx.get(), req, &resp)));
  return resp;
}

absl::StatusOr<int64_t> EmbeddingClient::StoreAdd(const std::string& key, int64_t delta) {
  v1::StoreAddRequest req;
  req.set_key(key);
  req.set_delta(delta);
  auto ctx = NewContext();
  v1::StoreAddResponse resp;
  // Not retried: a repeat would add twice.
  TESSERA_RETURN_IF_ERROR(
      wire::FromGrpcStatus(coordinator_.Get()->StoreAdd(ctx.get(), req, &resp)));
  return resp.value();
}

}  // namespace tessera::client
