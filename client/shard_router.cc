#include "client/shard_router.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "embedding/batch_ops.h"
#include "embedding/sharding.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace tessera::client {
namespace {}  // namespace

absl::Status FromShardStatus(const grpc::Status& status, int shard, const std::string& address) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat("shard ", shard, " (", address, "): ", status.error_message()));
}

ShardRouter::ShardRouter(std::vector<std::string> addresses, const RouterOptions& options)
    : addresses_(std::move(addresses)),
      options_(options),
      version_(options.shard_map_version),
      scratch_([shards = static_cast<int>(addresses_.size())] {
        auto s = std::make_unique<Scratch>();
        s->groups.resize(shards);
        s->lookups.resize(shards);
        s->lookup_responses.resize(shards);
        s->pushes.resize(shards);
        s->push_responses.resize(shards);
        return s;
      }) {
  for (const std::string& address : addresses_) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(options_.max_message_bytes);
    args.SetMaxSendMessageSize(options_.max_message_bytes);
    // A restarted server is found again within a second: gRPC's own reconnect backoff
    // (up to two minutes) would otherwise outlast the caller's retries.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    auto credentials = MakeChannelCredentials(options_.security, &args);
    stubs_.push_back(std::make_unique<ReconnectingStub<v1::EmbeddingShard>>(
        address, std::move(args), std::move(credentials)));
  }
  serving_ = std::make_unique<std::atomic<bool>[]>(addresses_.size());
  for (size_t k = 0; k < addresses_.size(); ++k) serving_[k] = true;
  if (options_.health_check_interval.count() > 0)
    monitor_ = std::thread([this] { MonitorHealth(); });
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
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    auto credentials = MakeChannelCredentials(options_.security, &args);
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
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + deadline);
  Authorize(options_.security, ctx.get());
  return ctx;
}

template <typename Response, typename Prepare>
std::vector<grpc::Status> ShardRouter::CallShards(const std::function<bool(int)>& has_work,
                                                  const Prepare& prepare,
                                                  std::vector<Response>* responses,
                                                  std::chrono::milliseconds deadline) const {
  std::vector<grpc::Status> statuses(num_shards());
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts(num_shards());
  std::vector<std::unique_ptr<grpc::ClientAsyncResponseReader<Response>>> calls(num_shards());
  grpc::CompletionQueue queue;
  int pending = 0;
  for (int k = 0; k < num_shards(); ++k) {
    if (!has_work(k)) continue;
    if (!serving(k)) {  // known down: fail now instead of waiting on it
      statuses[k] = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "down: failing its health checks; retry once it is back");
      continue;
    }
    contexts[k] = NewContext(deadline);
    calls[k] = prepare(k, contexts[k].get(), &queue);
    calls[k]->StartCall();
    calls[k]->Finish(&(*responses)[k], &statuses[k], reinterpret_cast<void*>(intptr_t{k}));
    ++pending;
  }
  void* tag = nullptr;
  bool ok = false;
  // Finish always completes (with the call's status, DEADLINE_EXCEEDED at the latest).
  for (; pending > 0 && queue.Next(&tag, &ok); --pending) {
  }
  queue.Shutdown();
  while (queue.Next(&tag, &ok)) {
  }
  for (int k = 0; k < num_shards(); ++k) {
    if (statuses[k].error_code() == grpc::StatusCode::UNAVAILABLE) stubs_[k]->Reset();
  }
  return statuses;
}

void ShardRouter::Split(const v1::TableConfig& config, absl::Span<const int64_t> ids,
                        Scratch* s) const {
  embedding::Unique(ids, &s->unique, &s->inverse);
  for (auto& g : s->groups) g.clear();
  const int shards = num_shards();
  for (size_t u = 0; u < s->unique.size(); ++u) {
    s->groups[embedding::ShardOf(s->unique[u], config.seed(), shards)].push_back(
        static_cast<int32_t>(u));
  }
}

absl::Status ShardRouter::CreateTable(const v1::TableConfig& config) {
  for (int k = 0; k < num_shards(); ++k) {
    auto ctx = NewContext();
    v1::CreateTableRequest req;
    *req.mutable_config() = config;
    v1::CreateTableResponse resp;
    absl::Status s =
        FromShardStatus(stubs_[k]->Get()->CreateTable(ctx.get(), req, &resp), k, addresses_[k]);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ShardRouter::Lookup(const v1::TableConfig& config, absl::Span<const int64_t> ids,
                                 absl::Span<float> out, bool read_only) {
  const int dim = config.dim();
  auto s = scratch_.Acquire();
  Split(config, ids, s.get());
  const auto& groups = s->groups;
  auto& reqs = s->lookups;
  auto& resps = s->lookup_responses;
  for (int k = 0; k < num_shards(); ++k) {
    if (groups[k].empty()) continue;
    reqs[k].Clear();
    reqs[k].set_table(config.name());
    reqs[k].set_read_only(read_only);
    reqs[k].set_shard_map_version(version_.load());
    auto* req_ids = reqs[k].mutable_ids();
    req_ids->Reserve(static_cast<int>(groups[k].size()));
    int64_t* dst = req_ids->AddNAlreadyReserved(static_cast<int>(groups[k].size()));
    for (size_t j = 0; j < groups[k].size(); ++j) dst[j] = s->unique[groups[k][j]];
  }
  const std::vector<grpc::Status> statuses =
      CallShards([&](int k) { return !groups[k].empty(); },
                 [&](int k, grpc::ClientContext* ctx, grpc::CompletionQueue* queue) {
                   return stubs_[k]->Get()->PrepareAsyncLookup(ctx, reqs[k], queue);
                 },
                 &resps);
  // Where each unique id's row lies in the shards' answers; then one gather into `out`.
  s->rows.resize(s->unique.size());
  for (int k = 0; k < num_shards(); ++k) {
    if (groups[k].empty()) continue;
    if (!statuses[k].ok()) return FromShardStatus(statuses[k], k, addresses_[k]);
    if (resps[k].values_size() != static_cast<int>(groups[k].size()) * dim) {
      return absl::InternalError(absl::StrCat("shard ", k, " (", addresses_[k], ") returned ",
                                              resps[k].values_size(), " floats, expected ",
                                              groups[k].size() * dim));
    }
    const float* values = resps[k].values().data();
    for (size_t j = 0; j < groups[k].size(); ++j) s->rows[groups[k][j]] = values + j * dim;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    std::copy_n(s->rows[s->inverse[i]], dim, out.data() + i * dim);
  }
  return absl::OkStatus();
}

absl::Status ShardRouter::PooledLookup(const v1::TableConfig& config, absl::Span<const int64_t> ids,
                                       absl::Span<const int32_t> offsets,
                                       absl::Span<const float> weights, v1::Pooling pooling,
                                       absl::Span<float> out, bool read_only) {
  const int dim = config.dim();
  const int bags = static_cast<int>(offsets.size()) - 1;
  std::vector<v1::LookupRequest> reqs(num_shards());
  for (int k = 0; k < num_shards(); ++k) {
    reqs[k].set_table(config.name());
    reqs[k].set_read_only(read_only);
    reqs[k].set_shard_map_version(version_.load());
    reqs[k].set_pooling(v1::SUM);  // MEAN is applied here, over the whole bag
    reqs[k].add_offsets(0);
  }
  std::vector<int32_t> shard_of(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    shard_of[i] = embedding::ShardOf(ids[i], config.seed(), num_shards());
  }
  for (int b = 0; b < bags; ++b) {
    for (int32_t i = offsets[b]; i < offsets[b + 1]; ++i) {
      v1::LookupRequest& r = reqs[shard_of[i]];
      r.add_ids(ids[i]);
      if (!weights.empty()) r.add_weights(weights[i]);
    }
    for (auto& r : reqs) r.add_offsets(r.ids_size());
  }
  std::vector<v1::LookupResponse> resps(num_shards());
  const std::vector<grpc::Status> statuses =
      CallShards([&](int k) { return reqs[k].ids_size() > 0; },
                 [&](int k, grpc::ClientContext* ctx, grpc::CompletionQueue* queue) {
                   return stubs_[k]->Get()->PrepareAsyncLookup(ctx, reqs[k], queue);
                 },
                 &resps);
  std::fill(out.begin(), out.end(), 0.0f);
  for (int k = 0; k < num_shards(); ++k) {
    if (reqs[k].ids_size() == 0) continue;
    if (!statuses[k].ok()) return FromShardStatus(statuses[k], k, addresses_[k]);
    if (resps[k].values_size() != bags * dim) {
      return absl::InternalError(absl::StrCat("shard ", k, " (", addresses_[k], ") returned ",
                                              resps[k].values_size(), " floats, expected ",
                                              bags * dim));
    }
    for (int j = 0; j < bags * dim; ++j) out[j] += resps[k].values(j);
  }
  if (pooling == v1::MEAN) {
    for (int b = 0; b < bags; ++b) {
      const int n = offsets[b + 1] - offsets[b];
      if (n == 0) continue;
      for (int j = 0; j < dim; ++j) out[b * dim + j] /= static_cast<float>(n);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ShardRouter::PushGradients(const v1::TableConfig& config,
                                                   absl::Span<const int64_t> ids,
                                                   absl::Span<const float> gradients,
                                                   int64_t step) {
  const int dim = config.dim();
  absl::Status finite = embedding::CheckFiniteGradients(config.name(), ids, gradients.data(), dim);
  if (!finite.ok()) return finite;
  auto s = scratch_.Acquire();
  Split(config, ids, s.get());
  const auto& groups = s->groups;
  auto& reqs = s->pushes;
  auto& resps = s->push_responses;
  // Repeated ids are summed straight into their row of the shard's request, in the
  // caller's order (the same additions, in the same order, as the in-process path).
  s->slots.resize(s->unique.size());
  for (int k = 0; k < num_shards(); ++k) {
    if (groups[k].empty()) continue;
    v1::PushGradientsRequest& r = reqs[k];
    r.Clear();
    r.set_table(config.name());
    r.set_step(step);
    r.set_shard_map_version(version_.load());
    const int n = static_cast<int>(groups[k].size());
    r.mutable_ids()->Reserve(n);
    int64_t* req_ids = r.mutable_ids()->AddNAlreadyReserved(n);
    r.mutable_gradients()->Resize(n * dim, 0.0f);
    float* g = r.mutable_gradients()->mutable_data();
    for (int j = 0; j < n; ++j) {
      const int32_t u = groups[k][j];
      req_ids[j] = s->unique[u];
      s->slots[u] = g + static_cast<size_t>(j) * dim;
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    float* dst = s->slots[s->inverse[i]];
    const float* src = gradients.data() + i * dim;
    for (int j = 0; j < dim; ++j) dst[j] += src[j];
  }
  const std::vector<grpc::Status> statuses =
      CallShards([&](int k) { return !groups[k].empty(); },
                 [&](int k, grpc::ClientContext* ctx, grpc::CompletionQueue* queue) {
                   return stubs_[k]->Get()->PrepareAsyncPushGradients(ctx, reqs[k], queue);
                 },
                 &resps);
  int64_t updated = 0;
  for (int k = 0; k < num_shards(); ++k) {
    if (groups[k].empty()) continue;
    if (!statuses[k].ok()) return FromShardStatus(statuses[k], k, addresses_[k]);
    updated += resps[k].rows_updated();
  }
  return updated;
}

namespace {

// Sends every shard `step` in a Checkpoint or Restore request through `call_shards` and
// returns each shard's CheckpointInfo, or the first failure naming its shard.
template <typename Request, typename Response, typename CallShardsFn>
absl::StatusOr<std::vector<v1::CheckpointInfo>> StepOnEveryShard(
    int64_t step, const std::vector<std::string>& addresses, const CallShardsFn& call_shards) {
  std::vector<Request> reqs(addresses.size());
  std::vector<Response> resps(addresses.size());
  for (auto& r : reqs) r.set_step(step);
  const std::vector<grpc::Status> statuses = call_shards(reqs, &resps);
  std::vector<v1::CheckpointInfo> out;
  for (size_t k = 0; k < addresses.size(); ++k) {
    if (!statuses[k].ok()) return FromShardStatus(statuses[k], static_cast<int>(k), addresses[k]);
    out.push_back(resps[k].checkpoint());
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<v1::CheckpointInfo>> ShardRouter::CheckpointShards(int64_t step) {
  return StepOnEveryShard<v1::CheckpointRequest, v1::CheckpointResponse>(
      step, addresses_, [&](const auto& reqs, auto* resps) {
        return CallShards([](int) { return true; },
                          [&](int k, grpc::ClientContext* ctx, grpc::CompletionQueue* queue) {
                            return stubs_[k]->Get()->PrepareAsyncCheckpoint(ctx, reqs[k], queue);
                          },
                          resps, options_.checkpoint_deadline);
      });
}

absl::StatusOr<std::vector<v1::CheckpointInfo>> ShardRouter::RestoreShards(int64_t step) {
  return StepOnEveryShard<v1::RestoreRequest, v1::RestoreResponse>(
      step, addresses_, [&](const auto& reqs, auto* resps) {
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
