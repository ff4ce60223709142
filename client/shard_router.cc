#include "client/shard_router.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "client/internal/shard_router_calls.h"
#include "embedding/batch_ops.h"
#include "embedding/embedding_table.h"
#include "embedding/sharding.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "wire/call_metadata.h"
#include "wire/grpc_status.h"
#include "wire/packed_bytes.h"
#include "wire/push_proto.h"
#include "wire/row_chunk.h"

namespace tessera::client {

absl::Status FromShardStatus(const grpc::Status& status, int shard, const std::string& address) {
  return Annotate(wire::FromGrpcStatus(status), absl::StrCat("shard ", shard, " (", address, ")"));
}

ShardRouter::ShardRouter(std::vector<std::string> addresses, const RouterOptions& options)
    : addresses_(std::move(addresses)),
      options_(options),
      client_id_(embedding::RandomNonZeroId()),
      version_(options.shard_map_version),
      scratch_([shards = static_cast<int>(addresses_.size())] {
        auto s = std::make_unique<Scratch>();
        s->lookups.resize(shards);
        s->lookup_responses.resize(shards);
        s->pushes.resize(shards);
        s->push_responses.resize(shards);
        return s;
      }) {
  for (const std::string& address : addresses_) {
    stubs_.push_back(NewShardStub(address, options_.security, options_.max_message_bytes));
  }
  serving_ = std::make_unique<std::atomic<bool>[]>(addresses_.size());
  incarnations_ = std::make_unique<std::atomic<uint64_t>[]>(addresses_.size());
  for (size_t k = 0; k < addresses_.size(); ++k) incarnations_[k].store(0);
  provisioned_ = std::make_unique<std::atomic<uint64_t>[]>(addresses_.size());
  for (size_t k = 0; k < addresses_.size(); ++k) provisioned_[k].store(0);
  for (size_t k = 0; k < addresses_.size(); ++k) serving_[k] = true;
  if (options_.health_check_interval.count() > 0)
    monitor_ = std::thread([this] { MonitorHealth(); });
}

std::unique_ptr<ReconnectingStub<v1::EmbeddingShard>> NewShardStub(
    const std::string& address, const wire::ClientSecurity& security, int max_message_bytes) {
  grpc::ChannelArguments args = ChannelArgs(max_message_bytes);
  auto credentials = wire::MakeChannelCredentials(security, &args);
  return std::make_unique<ReconnectingStub<v1::EmbeddingShard>>(address, std::move(args),
                                                                std::move(credentials));
}

ShardRouter::~ShardRouter() {
  {
    absl::MutexLock lock(&monitor_mu_);
    stop_monitor_ = true;
  }
  if (monitor_.joinable()) monitor_.join();
}

void ShardRouter::MonitorHealth() {
  std::vector<std::unique_ptr<grpc::health::v1::Health::Stub>> health;
  for (const auto& a : addresses_) {
    grpc::ChannelArguments args = ChannelArgs();
    auto credentials = wire::MakeChannelCredentials(options_.security, &args);
    health.push_back(
        grpc::health::v1::Health::NewStub(grpc::CreateCustomChannel(a, credentials, args)));
  }
  std::vector<int> failures(num_shards(), 0);
  const auto deadline = std::max(options_.health_check_interval, std::chrono::milliseconds(1000));
  absl::MutexLock lock(&monitor_mu_);
  while (!stop_monitor_) {
    monitor_mu_.Unlock();
    for (int k = 0; k < num_shards(); ++k) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + deadline);
      grpc::health::v1::HealthCheckResponse resp;
      const grpc::Status s = health[k]->Check(&ctx, {}, &resp);
      const bool ok = s.ok() && resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
      failures[k] = ok ? 0 : failures[k] + 1;
      const bool was = serving_[k].load();
      if (ok && !was) {
        serving_[k] = true;
        stubs_[k]->Reset();
        std::fprintf(stderr, "tessera: shard %d (%s) passes its health checks again: re-admitted\n",
                     k, addresses_[k].c_str());
        std::function<void(int)> readmitted;
        {
          absl::MutexLock callback_lock(&monitor_mu_);
          readmitted = on_readmit_;
        }
        if (readmitted) readmitted(k);
      } else if (!ok && was && failures[k] >= 2) {
        serving_[k] = false;
        std::fprintf(stderr, "tessera: shard %d (%s) is down: %s\n", k, addresses_[k].c_str(),
                     s.ok() ? "NOT_SERVING" : s.error_message().c_str());
      }
    }
    monitor_mu_.Lock();
    const absl::Condition stopped(&stop_monitor_);
    monitor_mu_.AwaitWithTimeout(stopped, absl::FromChrono(options_.health_check_interval));
  }
}

void ShardRouter::Reconnect() const {
  for (const auto& stub : stubs_) stub->Reset();
}

std::unique_ptr<grpc::ClientContext> ShardRouter::NewContext(
    std::chrono::milliseconds deadline) const {
  return wire::NewCallContext(options_.security, deadline);
}

void ShardRouter::ShardRestarted(int k) const {
  std::function<void(int)> callback;
  {
    absl::MutexLock lock(&monitor_mu_);
    callback = on_restart_;
  }
  if (callback) callback(k);
}

embedding::RequestId ShardRouter::NextRequestId() {
  return {client_id_, next_sequence_.fetch_add(1)};
}

void ShardRouter::Place(const v1::TableConfig& config, absl::Span<const int64_t> ids, bool distinct,
                        PartPlan* plan) const {
  if (distinct) {
    plan->unique.assign(ids.begin(), ids.end());
    plan->inverse.resize(ids.size());
    std::iota(plan->inverse.begin(), plan->inverse.end(), 0);
  } else {
    embedding::Unique(ids, &plan->unique, &plan->inverse);
  }
  const size_t n = plan->unique.size();
  plan->shard_of.resize(n);
  plan->slot.resize(n);
  plan->count.assign(num_shards(), 0);
  for (size_t u = 0; u < n; ++u) {
    const int k = embedding::ShardOfRow(config, plan->unique[u], num_shards());
    plan->shard_of[u] = k;
    plan->slot[u] = plan->count[k]++;
  }
}

template <typename Request, typename Response>
absl::Status ShardRouter::SendToEveryShard(const Request& request,
                                           StartCall<Request, Response> start,
                                           grpc::StatusCode also_done) const {
  std::vector<Response> resps(num_shards());
  const std::vector<grpc::Status> statuses = CallShardsWithRetries(
      std::vector<bool>(num_shards(), true),
      [&](int k, grpc::ClientContext* ctx, grpc::CompletionQueue* queue) {
        return ((*stubs_[k]->Get()).*start)(ctx, request, queue);
      },
      &resps, options_.deadline);
  for (int k = 0; k < num_shards(); ++k) {
    if (!statuses[k].ok() && statuses[k].error_code() != also_done) {
      return FromShardStatus(statuses[k], k, addresses_[k]);
    }
  }
  return absl::OkStatus();
}

absl::Status ShardRouter::CreateTable(const v1::TableConfig& config) {
  v1::CreateTableRequest request;
  *request.mutable_config() = config;
  return SendToEveryShard(request, &v1::EmbeddingShard::Stub::PrepareAsyncCreateTable);
}

bool ShardRouter::NoteIncarnation(int k, uint64_t incarnation, absl::string_view storage) const {
  if (incarnation == 0) return false;
  const uint64_t before = incarnations_[k].exchange(incarnation);
  uint64_t none = 0;  // the first one heard holds the tables this router made
  provisioned_[k].compare_exchange_strong(none, incarnation);
  const bool restarted = before != 0 && before != incarnation;
  if (restarted) {
    restarts_.fetch_add(1);
    const char* what =
        storage == "disk"     ? "its CHECKPOINT tables are back at their newest checkpoint, its "
                                "WRITE_THROUGH tables as last written"
        : storage == "memory" ? "it has no data directory, so its tables came back empty (they "
                                "are created again; their rows start anew)"
                              : "its CHECKPOINT tables are back at their newest checkpoint (a "
                                "shard without a data directory: empty)";
    std::fprintf(stderr,
                 "tessera: shard %d (%s) restarted (incarnation %016llx, was %016llx): %s\n", k,
                 addresses_[k].c_str(), static_cast<unsigned long long>(incarnation),
                 static_cast<unsigned long long>(before), what);
  }
  return restarted;
}

uint64_t ShardRouter::IncarnationDigest() const {
  uint64_t digest = 0x74657373657261ULL;
  for (size_t k = 0; k < addresses_.size(); ++k) {
    const uint64_t inc = incarnations_[k].load();
    if (inc == 0) return 0;
    digest = embedding::Mix64(digest ^ inc);
  }
  return digest == 0 ? 1 : digest;
}

absl::Status ShardRouter::ExportFrom(int k, const v1::ExportRowsRequest& request,
                                     const std::function<absl::Status(const v1::RowChunk&)>& sink) {
  auto ctx = NewContext(options_.checkpoint_deadline);
  std::unique_ptr<grpc::ClientReader<v1::RowChunk>> reader =
      stubs_[k]->Get()->ExportRows(ctx.get(), request);
  v1::RowChunk chunk;
  absl::Status sunk;
  while (sunk.ok() && reader->Read(&chunk)) sunk = sink(chunk);
  if (!sunk.ok()) {
    ctx->TryCancel();
    (void)reader->Finish();
    return sunk;
  }
  return FromShardStatus(reader->Finish(), k, addresses_[k]);
}

absl::Status ShardRouter::ImportRows(const v1::TableConfig& config,
                                     const embedding::RowBlock& rows) {
  TESSERA_RETURN_IF_ERROR(embedding::CheckVocabulary(config, rows.ids));
  const int shards = num_shards();
  std::vector<embedding::RowBlock> parts(shards);
  const int sf = rows.state.empty() ? 0 : rows.state_floats;
  for (auto& p : parts) {
    p.dim = rows.dim;
    p.state_floats = sf;
  }
  const size_t d = static_cast<size_t>(rows.dim);
  for (size_t i = 0; i < rows.size(); ++i) {
    embedding::RowBlock& p = parts[embedding::ShardOfRow(config, rows.ids[i], shards)];
    p.ids.push_back(rows.ids[i]);
    p.weights.insert(p.weights.end(), rows.weights.begin() + i * d,
                     rows.weights.begin() + (i + 1) * d);
    if (sf > 0) {
      p.state.insert(p.state.end(), rows.state.begin() + i * sf, rows.state.begin() + (i + 1) * sf);
    }
    if (!rows.last_steps.empty()) p.last_steps.push_back(rows.last_steps[i]);
    if (!rows.update_counts.empty()) p.update_counts.push_back(rows.update_counts[i]);
  }
  std::vector<v1::ImportRowsRequest> reqs(shards);
  std::vector<bool> work(shards, false);
  for (int k = 0; k < shards; ++k) {
    if (parts[k].ids.empty()) continue;
    work[k] = true;
    reqs[k].set_table(config.name());
    reqs[k].set_shard_map_version(version_.load());
    wire::ToChunk(parts[k], reqs[k].mutable_rows());
  }
  std::vector<v1::ImportRowsResponse> resps(shards);
  const std::vector<grpc::Status> statuses = CallShardsWithRetries(
      work,
      [&](int k, grpc::ClientContext* ctx, grpc::CompletionQueue* queue) {
        return stubs_[k]->Get()->PrepareAsyncImportRows(ctx, reqs[k], queue);
      },
      &resps, options_.deadline);
  return FirstFailure(statuses, work);
}

absl::StatusOr<std::vector<v1::TableConfig>> ShardRouter::ListTablesOn(int k) {
  auto ctx = NewContext();
  v1::ListTablesResponse resp;
  TESSERA_RETURN_IF_ERROR(
      FromShardStatus(stubs_[k]->Get()->ListTables(ctx.get(), {}, &resp), k, addresses_[k]));
  return std::vector<v1::TableConfig>(resp.tables().begin(), resp.tables().end());
}

absl::Status ShardRouter::DropTable(const std::string& table) {
  v1::DropTableRequest request;
  request.set_table(table);
  // A shard without the table has nothing to drop (a retry, or a shard that came back
  // empty): done there.
  return SendToEveryShard(request, &v1::EmbeddingShard::Stub::PrepareAsyncDropTable,
                          grpc::StatusCode::NOT_FOUND);
}

absl::Status ShardRouter::AlterTable(const std::string& table, const v1::OptimizerConfig& changes) {
  v1::AlterTableRequest request;
  request.set_table(table);
  *request.mutable_optimizer() = changes;
  return SendToEveryShard(request, &v1::EmbeddingShard::Stub::PrepareAsyncAlterTable);
}

absl::Status ShardRouter::CreateTableOn(int k, const v1::TableConfig& config) {
  auto ctx = NewContext();
  v1::CreateTableRequest req;
  *req.mutable_config() = config;
  v1::CreateTableResponse resp;
  return FromShardStatus(stubs_[k]->Get()->CreateTable(ctx.get(), req, &resp), k, addresses_[k]);
}

absl::Status ShardRouter::DropTableOn(int k, const std::string& table) {
  auto ctx = NewContext();
  v1::DropTableRequest req;
  req.set_table(table);
  v1::DropTableResponse resp;
  const grpc::Status s = stubs_[k]->Get()->DropTable(ctx.get(), req, &resp);
  if (s.error_code() == grpc::StatusCode::NOT_FOUND) return absl::OkStatus();
  return FromShardStatus(s, k, addresses_[k]);
}

absl::StatusOr<v1::ReshardResponse> ShardRouter::ReshardOn(int k,
                                                           const v1::ReshardRequest& request) {
  auto ctx = NewContext(options_.checkpoint_deadline);
  v1::ReshardResponse resp;
  TESSERA_RETURN_IF_ERROR(
      FromShardStatus(stubs_[k]->Get()->Reshard(ctx.get(), request, &resp), k, addresses_[k]));
  return resp;
}

void ShardRouter::AddUniqueIds(Scratch& s, size_t p, const v1::TableConfig& config,
                               std::vector<bool>& work) {
  const int shards = num_shards();
  const size_t num_parts = s.part_index.size() / shards;
  const PartPlan& plan = s.parts[p];
  auto& reqs = s.lookups;
  for (int k = 0; k < shards; ++k) {
    const size_t at = k * num_parts + p;
    s.ids_out[at] = nullptr;
    if (plan.count[k] == 0) continue;
    s.part_index[at] = reqs[k].tables_size();
    v1::TableLookup* t = reqs[k].add_tables();
    t->set_table(config.name());
    s.ids_out[at] = wire::ResizePacked<int64_t>(t->mutable_ids(), plan.count[k]);
    work[k] = true;
  }
  for (size_t u = 0; u < plan.unique.size(); ++u) {
    s.ids_out[plan.shard_of[u] * num_parts + p][plan.slot[u]] = plan.unique[u];
  }
}

base::ThreadPool& ShardRouter::Pool(size_t ids) const {
  return options_.pool != nullptr ? options_.pool->For(ids, kParallelIds)
                                  : base::ThreadPool::CallingThread();
}

namespace {

template <typename Part>
size_t TotalIds(absl::Span<const Part> parts) {
  size_t n = 0;
  for (const Part& part : parts) n += part.ids.size();
  return n;
}

}  // namespace

void ShardRouter::AddShardBags(Scratch& s, size_t p, const v1::TableConfig& config,
                               const embedding::TableBags& part, std::vector<bool>& work) {
  const int shards = num_shards();
  const size_t num_parts = s.part_index.size() / shards;
  const size_t bags = part.offsets.size() - 1;
  PartPlan& plan = s.parts[p];
  auto& reqs = s.lookups;
  // Per shard: its ids of every bag in bag order, their weights, and bags+1 offsets.
  std::vector<std::vector<int64_t>> ids(shards);
  std::vector<std::vector<float>> weights(shards);
  std::vector<std::vector<int32_t>> offsets(shards, std::vector<int32_t>{0});
  plan.shard_of.resize(part.ids.size());
  for (size_t i = 0; i < part.ids.size(); ++i) {
    plan.shard_of[i] = embedding::ShardOfRow(config, part.ids[i], shards);
  }
  for (size_t b = 0; b < bags; ++b) {
    for (int32_t i = part.offsets[b]; i < part.offsets[b + 1]; ++i) {
      ids[plan.shard_of[i]].push_back(part.ids[i]);
      if (!part.weights.empty()) weights[plan.shard_of[i]].push_back(part.weights[i]);
    }
    for (int k = 0; k < shards; ++k) offsets[k].push_back(static_cast<int32_t>(ids[k].size()));
  }
  for (int k = 0; k < shards; ++k) {
    if (ids[k].empty()) continue;
    s.part_index[k * num_parts + p] = reqs[k].tables_size();
    v1::TableLookup* t = reqs[k].add_tables();
    t->set_table(config.name());
    t->set_pooling(v1::SUM);  // MEAN and SQRTN are applied here, over the whole bag
    wire::SetPacked<int64_t>(ids[k], t->mutable_ids());
    wire::SetPacked<int32_t>(offsets[k], t->mutable_offsets());
    wire::SetPacked<float>(weights[k], t->mutable_weights());
    work[k] = true;
  }
}

absl::StatusOr<const char*> ShardRouter::LookupAnswer(const Scratch& s, int k, size_t p,
                                                      size_t num_parts, size_t rows,
                                                      const v1::TableConfig& config) const {
  const int dim = config.dim();
  const int idx = s.part_index[k * num_parts + p];
  const auto& resp = s.lookup_responses[k];
  if (idx >= resp.tables_size() || resp.tables(idx).dim() != dim ||
      resp.tables(idx).values().size() != rows * dim * sizeof(float)) {
    return absl::InternalError(absl::StrCat("shard ", k, " (", addresses_[k],
                                            "): answer for table '", config.name(), "' is not ",
                                            rows, " rows of dim ", dim));
  }
  return resp.tables(idx).values().data();
}

absl::Status ShardRouter::MergeShardBags(const Scratch& s, size_t p, size_t num_parts,
                                         const v1::TableConfig& config,
                                         const embedding::TableBags& part) {
  const size_t bags = part.offsets.size() - 1;
  std::vector<const char*> partials;
  for (int k = 0; k < num_shards(); ++k) {
    if (s.part_index[k * num_parts + p] < 0) continue;
    TESSERA_ASSIGN_OR_RETURN(const char* values, LookupAnswer(s, k, p, num_parts, bags, config));
    partials.push_back(values);
  }
  embedding::AddPartialBags(partials, config.dim(), part.offsets, part.pooling, part.out.data());
  return absl::OkStatus();
}

absl::Status ShardRouter::MergeUniqueRows(Scratch& s, size_t p, size_t num_parts,
                                          const v1::TableConfig& config,
                                          const embedding::TableBags& part) {
  const int shards = num_shards();
  const int dim = config.dim();
  const size_t row_bytes = dim * sizeof(float);
  PartPlan& plan = s.parts[p];
  // Runs beside the other parts' merges: its answers' pointers are its own.
  plan.values_in.assign(shards, nullptr);
  for (int k = 0; k < shards; ++k) {
    if (s.part_index[k * num_parts + p] < 0) continue;
    TESSERA_ASSIGN_OR_RETURN(plan.values_in[k],
                             LookupAnswer(s, k, p, num_parts, plan.count[k], config));
  }
  plan.rows.resize(plan.unique.size() * dim);
  for (size_t u = 0; u < plan.unique.size(); ++u) {
    std::memcpy(plan.rows.data() + u * dim,
                plan.values_in[plan.shard_of[u]] + plan.slot[u] * row_bytes, row_bytes);
  }
  embedding::RowsToAnswer(plan.rows.data(), dim, plan.inverse, part.offsets, part.weights,
                          part.pooling, part.out.data());
  return absl::OkStatus();
}

absl::Status ShardRouter::ForwardAnswers(Scratch& s, size_t p, size_t num_parts,
                                         const v1::TableConfig& config,
                                         const embedding::TableBags& part,
                                         v1::TableValues* answer) {
  const PartPlan& plan = s.parts[p];
  const size_t bags = part.offsets.empty() ? 0 : part.offsets.size() - 1;
  answer->clear_values();
  answer->set_shard_pooled(plan.shard_pools);
  // Each shard's block moves into the answer as it came (no float is read or copied);
  // its first row's place in the blocks taken end to end.
  std::vector<int32_t> base(num_shards(), 0);
  int32_t rows = 0;
  for (int k = 0; k < num_shards(); ++k) {
    const int idx = s.part_index[k * num_parts + p];
    if (idx < 0) continue;
    const size_t count = plan.shard_pools ? bags : static_cast<size_t>(plan.count[k]);
    TESSERA_RETURN_IF_ERROR(LookupAnswer(s, k, p, num_parts, count, config).status());
    answer->add_shard_values()->swap(*s.lookup_responses[k].mutable_tables(idx)->mutable_values());
    base[k] = rows;
    rows += static_cast<int32_t>(count);
  }
  if (plan.shard_pools) return absl::OkStatus();
  int32_t* row_of = wire::ResizePacked<int32_t>(answer->mutable_row_of_ids(), plan.inverse.size());
  for (size_t i = 0; i < plan.inverse.size(); ++i) {
    const int32_t u = plan.inverse[i];
    row_of[i] = base[plan.shard_of[u]] + plan.slot[u];
  }
  return absl::OkStatus();
}

void ShardRouter::FillIdPlan(const PartPlan& plan, const v1::TableConfig& config,
                             const embedding::TableBags& part) const {
  if (part.plan == nullptr) return;
  // The caller's gradients of these ids need not deduplicate them again. (Not grouped by
  // shard: the push is placed afresh.)
  part.plan->unique_ids.assign(plan.unique.begin(), plan.unique.end());
  part.plan->inverse.assign(plan.inverse.begin(), plan.inverse.end());
  part.plan->shard_begin.clear();
  part.plan->seed = config.seed();
  part.plan->num_shards = num_shards();
  part.plan->valid = true;
}

absl::Status ShardRouter::PlanLookup(Scratch& s, absl::Span<const v1::TableConfig> configs,
                                     absl::Span<const embedding::TableBags> parts, bool read_only,
                                     std::vector<bool>* work) {
  const int shards = num_shards();
  const size_t num_parts = parts.size();
  for (size_t p = 0; p < num_parts; ++p) {
    TESSERA_RETURN_IF_ERROR(embedding::CheckVocabulary(configs[p], parts[p].ids));
  }
  s.parts.resize(std::max(s.parts.size(), num_parts));
  s.part_index.assign(static_cast<size_t>(shards) * num_parts, -1);
  auto& reqs = s.lookups;
  for (int k = 0; k < shards; ++k) {
    reqs[k].Clear();
    reqs[k].set_read_only(read_only);
    reqs[k].set_shard_map_version(version_.load());
  }
  for (const embedding::TableBags& part : parts) {
    if (part.plan != nullptr) part.plan->valid = false;
  }
  work->assign(shards, false);
  // Each table's ids deduplicated and placed on their shards, a table to a thread; then
  // into the shards' requests one table after another.
  s.ids_out.assign(static_cast<size_t>(shards) * num_parts, nullptr);
  Pool(TotalIds(parts)).ParallelFor(static_cast<int>(num_parts), [&](int p) {
    const embedding::TableBags& part = parts[p];
    PartPlan& plan = s.parts[p];
    Place(configs[p], part.ids, /*distinct=*/false, &plan);
    // Bags of many ids: each shard pools its share, so only pooled vectors travel.
    plan.shard_pools = !part.offsets.empty() && plan.unique.size() > part.offsets.size() - 1;
  });
  for (size_t p = 0; p < num_parts; ++p) {
    const embedding::TableBags& part = parts[p];
    const PartPlan& plan = s.parts[p];
    if (plan.shard_pools) {
      AddShardBags(s, p, configs[p], part, *work);
    } else {
      AddUniqueIds(s, p, configs[p], *work);
    }
  }
  return absl::OkStatus();
}

absl::Status ShardRouter::MergeLookup(Scratch& s, absl::Span<const v1::TableConfig> configs,
                                      absl::Span<const embedding::TableBags> parts,
                                      v1::BatchLookupResponse* forward) {
  const size_t num_parts = parts.size();
  if (forward != nullptr && forward->tables_size() != static_cast<int>(num_parts)) {
    return absl::InternalError(absl::StrCat("an answer of ", forward->tables_size(),
                                            " tables to forward ", num_parts, " parts into"));
  }
  return Pool(TotalIds(parts))
      .ParallelForStatus(static_cast<int>(num_parts), [&](int p) -> absl::Status {
        if (forward != nullptr) {
          TESSERA_RETURN_IF_ERROR(
              ForwardAnswers(s, p, num_parts, configs[p], parts[p], forward->mutable_tables(p)));
        } else {
          TESSERA_RETURN_IF_ERROR(s.parts[p].shard_pools
                                      ? MergeShardBags(s, p, num_parts, configs[p], parts[p])
                                      : MergeUniqueRows(s, p, num_parts, configs[p], parts[p]));
        }
        FillIdPlan(s.parts[p], configs[p], parts[p]);
        return absl::OkStatus();
      });
}

absl::Status ShardRouter::FirstFailure(const std::vector<grpc::Status>& statuses,
                                       const std::vector<bool>& work) const {
  for (int k = 0; k < num_shards(); ++k) {
    if (work[k] && !statuses[k].ok()) return FromShardStatus(statuses[k], k, addresses_[k]);
  }
  return absl::OkStatus();
}

std::vector<grpc::Status> ShardRouter::SendLookups(Scratch& s, const std::vector<bool>& work) {
  return CallShardsWithRetries(
      work,
      [&](int k, grpc::ClientContext* ctx, grpc::CompletionQueue* queue) {
        return stubs_[k]->Get()->PrepareAsyncBatchLookup(ctx, s.lookups[k], queue);
      },
      &s.lookup_responses, options_.deadline, /*reprovision=*/true);
}

absl::Status ShardRouter::LookupBatch(absl::Span<const v1::TableConfig> configs,
                                      absl::Span<const embedding::TableBags> parts, bool read_only,
                                      v1::BatchLookupResponse* forward) {
  auto s = scratch_.Acquire();
  std::vector<bool> work;
  TESSERA_RETURN_IF_ERROR(PlanLookup(*s, configs, parts, read_only, &work));
  const std::vector<grpc::Status> statuses = SendLookups(*s, work);
  TESSERA_RETURN_IF_ERROR(FirstFailure(statuses, work));
  return MergeLookup(*s, configs, parts, forward);
}

absl::StatusOr<std::vector<int64_t>> ShardRouter::PushThenLookup(
    const embedding::CheckedPush& push, int64_t step, const embedding::RequestId& request_id,
    bool after_lookup, absl::Span<const v1::TableConfig> configs,
    absl::Span<const embedding::TableBags> parts, bool read_only,
    v1::BatchLookupResponse* forward) {
  const int shards = num_shards();
  const embedding::RequestId id = request_id.empty() ? NextRequestId() : request_id;
  auto pushed = scratch_.Acquire();
  std::vector<bool> push_work;
  TESSERA_RETURN_IF_ERROR(PlanPush(*pushed, push, step, id, {}, &push_work));
  if (!after_lookup && std::count(push_work.begin(), push_work.end(), true) > 1) {
    // Its check round cannot ride on a lookup: the push goes alone, then the lookup.
    TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> updated,
                             SendPush(*pushed, push, id, {}, after_lookup, &push_work));
    TESSERA_RETURN_IF_ERROR(LookupBatch(configs, parts, read_only, forward));
    return updated;
  }
  auto looked = scratch_.Acquire();
  std::vector<bool> work;
  TESSERA_RETURN_IF_ERROR(PlanLookup(*looked, configs, parts, read_only, &work));
  // Each shard's part of the push rides in its lookup request, and comes back in its answer.
  auto swap_pushes = [&](const std::vector<grpc::Status>* statuses) {
    for (int k = 0; k < shards; ++k) {
      if (!push_work[k]) continue;
      looked->lookups[k].mutable_push()->Swap(&pushed->pushes[k]);
      if (statuses != nullptr && (*statuses)[k].ok()) {
        looked->lookup_responses[k].mutable_push()->Swap(&pushed->push_responses[k]);
      }
    }
  };
  for (int k = 0; k < shards; ++k) {
    // One map for both: were the version read apart to change in between, a shard could
    // apply the push and refuse the lookup.
    looked->lookups[k].set_shard_map_version(pushed->pushes[k].shard_map_version());
    work[k] = work[k] || push_work[k];
  }
  swap_pushes(nullptr);
  const std::vector<grpc::Status> statuses = SendLookups(*looked, work);
  swap_pushes(&statuses);
  // A failure names the shards that applied the push (a repeat under its id applies the rest).
  TESSERA_RETURN_IF_ERROR(PushOutcome(statuses, push_work, id));
  TESSERA_RETURN_IF_ERROR(FirstFailure(statuses, work));
  TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> updated, RowsUpdated(*pushed, push.configs()));
  TESSERA_RETURN_IF_ERROR(MergeLookup(*looked, configs, parts, forward));
  return updated;
}

namespace {

// Sends every shard `step` in a Checkpoint or Restore request through `call_shards` and
// returns each shard's CheckpointInfo, or the first failure naming its shard.
template <typename Request, typename Response, typename CallShardsFn>
absl::StatusOr<std::vector<v1::CheckpointInfo>> StepOnEveryShard(
    const Request& request, const std::vector<std::string>& addresses,
    const CallShardsFn& call_shards) {
  std::vector<Request> reqs(addresses.size(), request);
  std::vector<Response> resps(addresses.size());
  const std::vector<grpc::Status> statuses = call_shards(reqs, &resps);
  std::vector<v1::CheckpointInfo> out;
  for (size_t k = 0; k < addresses.size(); ++k) {
    if (!statuses[k].ok()) return FromShardStatus(statuses[k], static_cast<int>(k), addresses[k]);
    out.push_back(resps[k].checkpoint());
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<v1::CheckpointInfo>> ShardRouter::CheckpointShards(
    const v1::CheckpointRequest& request) {
  return StepOnEveryShard<v1::CheckpointRequest, v1::CheckpointResponse>(
      request, addresses_, [&](const auto& reqs, auto* resps) {
        return CallShards([](int) { return true; },
                          [&](int k, grpc::ClientContext* ctx, grpc::CompletionQueue* queue) {
                            return stubs_[k]->Get()->PrepareAsyncCheckpoint(ctx, reqs[k], queue);
                          },
                          resps, options_.checkpoint_deadline);
      });
}

absl::StatusOr<std::vector<v1::CheckpointInfo>> ShardRouter::RestoreShards(
    const v1::RestoreRequest& request) {
  return StepOnEveryShard<v1::RestoreRequest, v1::RestoreResponse>(
      request, addresses_, [&](const auto& reqs, auto* resps) {
        return CallShards([](int) { return true; },
                          [&](int k, grpc::ClientContext* ctx, grpc::CompletionQueue* queue) {
                            return stubs_[k]->Get()->PrepareAsyncRestore(ctx, reqs[k], queue);
                          },
                          resps, options_.checkpoint_deadline);
      });
}

absl::StatusOr<std::vector<v1::TableStats>> ShardRouter::Stats(const std::string& table) {
  std::vector<v1::TableStats> out;
  for (int k = 0; k < num_shards(); ++k) {
    // A shard failing its health checks has nothing to report: it is left out (callers
    // see it as not serving in the shard map) instead of failing the whole call.
    if (!serving(k)) continue;
    auto ctx = NewContext();
    v1::StatsRequest req;
    req.set_table(table);
    v1::StatsResponse resp;
    absl::Status s =
        FromShardStatus(stubs_[k]->Get()->Stats(ctx.get(), req, &resp), k, addresses_[k]);
    if (!s.ok()) return s;
    for (const auto& t : resp.tables()) out.push_back(t);
  }
  return out;
}

}  // namespace tessera::client
