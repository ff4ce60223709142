// ShardRouter's pushes: each table's ids placed on their shards with their summed
// gradients, a check round where a push spans shards, sync groups, and the outcome.
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
#include "client/shard_router.h"
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

void ShardRouter::AddPushPart(Scratch& s, size_t p, const v1::TableConfig& config,
                              std::vector<bool>& work) {
  const int shards = num_shards();
  const size_t num_parts = s.part_index.size() / shards;
  const PartPlan& plan = s.parts[p];
  auto& reqs = s.pushes;
  for (int k = 0; k < shards; ++k) {
    const size_t at = k * num_parts + p;
    s.ids_out[at] = nullptr;
    s.grads_out[at] = nullptr;
    if (plan.count[k] == 0) continue;
    s.part_index[at] = reqs[k].tables_size();
    v1::TableGradients* t = reqs[k].add_tables();
    t->set_table(config.name());
    s.ids_out[at] = wire::ResizePacked<int64_t>(t->mutable_ids(), plan.count[k]);
    s.grads_out[at] = wire::ResizePacked<float>(t->mutable_gradients(),
                                                static_cast<size_t>(plan.count[k]) * config.dim());
    work[k] = true;
  }
}

absl::Status ShardRouter::FillPushPart(Scratch& s, size_t p, const v1::TableConfig& config,
                                       const embedding::TableGradients& part) const {
  const int shards = num_shards();
  const size_t num_parts = s.part_index.size() / shards;
  const int dim = config.dim();
  const PartPlan& plan = s.parts[p];
  auto ids_of = [&](int k) { return s.ids_out[k * num_parts + p]; };
  auto grads_of = [&](int k) { return s.grads_out[k * num_parts + p]; };
  for (size_t u = 0; u < plan.unique.size(); ++u) {
    ids_of(plan.shard_of[u])[plan.slot[u]] = plan.unique[u];
  }
  if (plan.unique.size() == part.ids.size()) {
    // Distinct ids: each row goes as it came (as the in-process path applies it).
    for (size_t i = 0; i < part.ids.size(); ++i) {
      const int32_t u = plan.inverse[i];
      std::memcpy(grads_of(plan.shard_of[u]) + static_cast<size_t>(plan.slot[u]) * dim,
                  part.gradients.data() + i * dim, dim * sizeof(float));
    }
    // Without repeats the rows are the gradients, checked where the push entered this
    // process.
    return absl::OkStatus();
  }
  for (int k = 0; k < shards; ++k) {
    if (plan.count[k] == 0) continue;
    std::fill_n(grads_of(k), static_cast<size_t>(plan.count[k]) * dim, 0.0f);
  }
  // Repeated ids are summed straight into their row of the shard's request, in the
  // caller's order (the same additions, in the same order, as the in-process path).
  for (size_t i = 0; i < part.ids.size(); ++i) {
    const int32_t u = plan.inverse[i];
    float* dst = grads_of(plan.shard_of[u]) + static_cast<size_t>(plan.slot[u]) * dim;
    const float* src = part.gradients.data() + i * dim;
    for (int j = 0; j < dim; ++j) dst[j] += src[j];
  }
  // Finite gradients of a repeated id can sum to Inf: refused here, before any shard
  // applies its part (the one shard holding the id would refuse only its own).
  for (int k = 0; k < shards; ++k) {
    if (plan.count[k] == 0) continue;
    TESSERA_RETURN_IF_ERROR(Annotate(
        embedding::CheckFiniteGradients(
            config.name(), absl::MakeConstSpan(ids_of(k), plan.count[k]), grads_of(k), dim),
        "summed over repeated ids"));
  }
  return absl::OkStatus();
}

namespace {

// Whether `part`'s ids are the distinct ids of the lookup plan this router made for it (the
// same memory, the same table seed): they need no second deduplication. (Were they changed
// since, each shard still sums repeated ids; only the rows-updated count would be off.)
bool PlannedIds(const v1::TableConfig& config, const embedding::TableGradients& part) {
  const embedding::IdPlan* plan = part.plan;
  return plan != nullptr && plan->valid && plan->shard_begin.empty() &&
         plan->seed == config.seed() && part.ids.data() == plan->unique_ids.data() &&
         part.ids.size() == plan->unique_ids.size();
}

}  // namespace

absl::Status ShardRouter::CheckPushIds(const embedding::CheckedPush& push) {
  for (size_t p = 0; p < push.size(); ++p) {
    TESSERA_RETURN_IF_ERROR(embedding::CheckVocabulary(push.configs()[p], push.parts()[p].ids));
  }
  return absl::OkStatus();
}

absl::Status ShardRouter::PlanPush(Scratch& s, const embedding::CheckedPush& push, int64_t step,
                                   const embedding::RequestId& id, const embedding::PushSync& sync,
                                   std::vector<bool>* work) {
  const absl::Span<const v1::TableConfig> configs = push.configs();
  const absl::Span<const embedding::TableGradients> parts = push.parts();
  const int shards = num_shards();
  const size_t num_parts = parts.size();
  TESSERA_RETURN_IF_ERROR(CheckPushIds(push));
  s.parts.resize(std::max(s.parts.size(), num_parts));
  s.part_index.assign(static_cast<size_t>(shards) * num_parts, -1);
  auto& reqs = s.pushes;
  for (int k = 0; k < shards; ++k) {
    reqs[k].Clear();
    reqs[k].set_step(step);
    reqs[k].set_shard_map_version(version_.load());
    wire::ToProto(id, reqs[k].mutable_request_id());
    if (sync.active()) wire::ToProto(sync, reqs[k].mutable_sync());
  }
  // In a sync group every shard takes part in every step.
  work->assign(shards, sync.active());
  // Each table placed, a table to a thread; its rows in the requests, one table after
  // another; then filled and checked, a table to a thread.
  size_t ids = 0;
  for (const embedding::TableGradients& part : parts) ids += part.ids.size();
  base::ThreadPool& pool = Pool(ids);
  pool.ParallelFor(static_cast<int>(num_parts), [&](int p) {
    Place(configs[p], parts[p].ids, PlannedIds(configs[p], parts[p]), &s.parts[p]);
  });
  s.ids_out.assign(static_cast<size_t>(shards) * num_parts, nullptr);
  s.grads_out.assign(static_cast<size_t>(shards) * num_parts, nullptr);
  for (size_t p = 0; p < num_parts; ++p) AddPushPart(s, p, configs[p], *work);
  return pool.ParallelForStatus(static_cast<int>(num_parts),
                                [&](int p) { return FillPushPart(s, p, configs[p], parts[p]); });
}

absl::StatusOr<std::vector<int64_t>> ShardRouter::PushBatch(const embedding::CheckedPush& push,
                                                            int64_t step,
                                                            const embedding::RequestId& request_id,
                                                            const embedding::PushSync& sync,
                                                            bool after_lookup) {
  const embedding::RequestId id = request_id.empty() ? NextRequestId() : request_id;
  auto s = scratch_.Acquire();
  std::vector<bool> work;
  TESSERA_RETURN_IF_ERROR(PlanPush(*s, push, step, id, sync, &work));
  return SendPush(*s, push, id, sync, after_lookup, &work);
}

absl::StatusOr<std::vector<int64_t>> ShardRouter::SendPush(
    Scratch& s, const embedding::CheckedPush& push, const embedding::RequestId& id,
    const embedding::PushSync& sync, bool after_lookup, std::vector<bool>* work) {
  const int shards = num_shards();
  auto& reqs = s.pushes;
  auto send = [&] {
    return CallShardsWithRetries(
        *work,
        [&](int k, grpc::ClientContext* ctx, grpc::CompletionQueue* queue) {
          return stubs_[k]->Get()->PrepareAsyncBatchPush(ctx, reqs[k], queue);
        },
        &s.push_responses,
        sync.active() ? wire::SyncDeadline(sync, options_.deadline) : options_.deadline,
        /*reprovision=*/true);
  };
  // A push spanning shards is one unit: each shard checks its part (room included)
  // before any applies, unless a lookup of the same ids already did (every shard passed
  // the same checks and holds the rows), or the shards of a sync group apply it together.
  if (!sync.active() && !after_lookup && std::count(work->begin(), work->end(), true) > 1) {
    for (int k = 0; k < shards; ++k) reqs[k].set_check_only(true);
    const std::vector<grpc::Status> checked = send();
    for (int k = 0; k < shards; ++k) reqs[k].set_check_only(false);
    for (int k = 0; k < shards; ++k) {
      if ((*work)[k] && !checked[k].ok()) {
        return Annotate(FromShardStatus(checked[k], k, addresses_[k]),
                        "push refused; no shard applied it");
      }
    }
  }
  std::vector<grpc::Status> statuses;
  if (sync.active()) {
    TESSERA_ASSIGN_OR_RETURN(statuses, SendInSyncGroup(sync, work, send));
  } else {
    statuses = send();
  }
  TESSERA_RETURN_IF_ERROR(PushOutcome(statuses, *work, id));
  return RowsUpdated(s, push.configs());
}

absl::StatusOr<std::vector<int64_t>> ShardRouter::RowsUpdated(
    const Scratch& s, absl::Span<const v1::TableConfig> configs) const {
  const size_t num_parts = configs.size();
  std::vector<int64_t> updated(num_parts, 0);
  for (int k = 0; k < num_shards(); ++k) {
    for (size_t p = 0; p < num_parts; ++p) {
      const int idx = s.part_index[k * num_parts + p];
      if (idx < 0) continue;
      if (idx >= s.push_responses[k].rows_updated_size()) {
        return absl::InternalError(absl::StrCat("shard ", k, " (", addresses_[k],
                                                "): push answer lacks table '", configs[p].name(),
                                                "'"));
      }
      updated[p] += s.push_responses[k].rows_updated(idx);
    }
  }
  return updated;
}

absl::StatusOr<std::vector<grpc::Status>> ShardRouter::SendInSyncGroup(
    const embedding::PushSync& sync, std::vector<bool>* work,
    const std::function<std::vector<grpc::Status>()>& send) {
  TESSERA_RETURN_IF_ERROR(RegisterSyncGroup(sync));
  std::vector<grpc::Status> statuses = send();
  // A shard that lost the group (it restarted, or joined in a reshard) refuses the push
  // FAILED_PRECONDITION: registered again, it gets its part again under the same request
  // id (a shard whose refusal had another cause refuses it again).
  std::vector<bool> lost(num_shards(), false);
  for (int k = 0; k < num_shards(); ++k) {
    lost[k] = (*work)[k] && statuses[k].error_code() == grpc::StatusCode::FAILED_PRECONDITION;
  }
  if (std::count(lost.begin(), lost.end(), true) == 0 ||
      !RegisterSyncGroup(sync, lost, /*again=*/true).ok()) {
    return statuses;
  }
  const std::vector<bool> all = std::exchange(*work, lost);
  const std::vector<grpc::Status> resent = send();
  *work = all;
  for (int k = 0; k < num_shards(); ++k) {
    if (lost[k]) statuses[k] = resent[k];
  }
  return statuses;
}

absl::Status ShardRouter::RegisterSyncGroup(const embedding::PushSync& sync,
                                            std::vector<bool> shards, bool again) {
  if (shards.empty()) shards.assign(num_shards(), true);
  {
    absl::MutexLock lock(&groups_mu_);
    std::vector<int>& known = registered_[sync.job];
    known.resize(num_shards(), 0);
    for (int k = 0; k < num_shards(); ++k) {
      if (!again && known[k] == sync.workers) shards[k] = false;
    }
  }
  if (std::count(shards.begin(), shards.end(), true) == 0) return absl::OkStatus();
  v1::RegisterSyncGroupRequest request;
  request.mutable_group()->set_job(sync.job);
  request.mutable_group()->set_workers(sync.workers);
  std::vector<v1::RegisterSyncGroupResponse> responses(num_shards());
  const std::vector<grpc::Status> statuses = CallShardsWithRetries(
      shards,
      [&](int k, grpc::ClientContext* ctx, grpc::CompletionQueue* queue) {
        return stubs_[k]->Get()->PrepareAsyncRegisterSyncGroup(ctx, request, queue);
      },
      &responses, options_.deadline);
  absl::Status first;
  absl::MutexLock lock(&groups_mu_);
  std::vector<int>& known = registered_[sync.job];
  for (int k = 0; k < num_shards(); ++k) {
    if (!shards[k]) continue;
    known[k] = statuses[k].ok() ? sync.workers : 0;
    if (!statuses[k].ok() && first.ok()) first = FromShardStatus(statuses[k], k, addresses_[k]);
  }
  return first;
}

absl::Status ShardRouter::PushOutcome(const std::vector<grpc::Status>& statuses,
                                      const std::vector<bool>& work,
                                      const embedding::RequestId& id) const {
  std::vector<std::string> applied, refused;
  absl::Status first;
  for (int k = 0; k < num_shards(); ++k) {
    if (!work[k]) continue;
    const std::string shard = absl::StrCat(k, " (", addresses_[k], ")");
    if (statuses[k].ok()) {
      applied.push_back(shard);
    } else {
      refused.push_back(shard);
      if (first.ok()) first = FromShardStatus(statuses[k], k, addresses_[k]);
    }
  }
  if (first.ok() || applied.empty()) return first;
  // Shards that applied their part answer a repeat from their journal: the same request
  // id again applies only the rest.
  absl::Status out(first.code(),
                   absl::StrCat(first.message(), "; push ", id.client_id, ":", id.sequence,
                                " was applied on shard(s) ", absl::StrJoin(applied, ", "),
                                " but not on ", absl::StrJoin(refused, ", "),
                                ": send it again under the same request id (PushOptions.request_id "
                                "{client_id, sequence}) to apply the rest, never under a new one"));
  first.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

}  // namespace tessera::client
