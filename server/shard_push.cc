// ShardService's pushes: PushGradients, BatchPush (on the callback API: a sync-group push
// waits in its step without a thread), exactly once per request id, across reshards.
#include <algorithm>
#include <memory>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/check.h"
#include "base/status.h"
#include "embedding/batch_ops.h"
#include "embedding/embedding_table.h"
#include "server/shard_service.h"
#include "wire/grpc_status.h"
#include "wire/push_proto.h"

namespace tessera::server {

namespace {

// A request id already used by a push of another shape: its first answer does not fit.
absl::Status ReusedRequestId(const embedding::RequestId& id, size_t tables) {
  return absl::InvalidArgumentError(
      absl::StrCat("request id ", id.client_id, ":", id.sequence,
                   " was used by an earlier push of another number of tables (or another "
                   "sync group) than this one's ",
                   tables, ": a request id names one push; give each push its own"));
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> ShardService::ApplyPush(const DecodedBatch& whole,
                                                             int64_t step,
                                                             const embedding::RequestId& request) {
  // A push retried across a reshard: the ids whose rows took it under the old map are left
  // out (and counted as updated).
  DecodedBatch kept;
  std::vector<int64_t> skipped;
  const bool filtered = WithoutMovedPushes(whole, request, &kept, &skipped);
  const DecodedBatch& batch = filtered ? kept : whole;
  const uint64_t version = version_.load();  // pushes in flight hold off a commit
  const embedding::RequestId id = JournalIdAt(request, version);
  auto table_of = [&](size_t i) { return batch.pushes[i].table; };
  absl::StatusOr<std::vector<int64_t>> result = journal_.Run(
      id, batch.pushes.size(),
      [&](std::vector<int64_t>* done) -> absl::Status {
        // A collection that applies a batch whole (every part checked first, then every
        // part applied, its tables in parallel) takes it in one call.
        if (done->empty() && tables_->AppliesBatchWhole()) {
          return ApplyWhole(batch, step, embedding::PushTag{id, 0, version}, done);
        }
        if (done->empty() && batch.pushes.size() > 1) {
          // Applied part by part: every part's room is checked before the first applies,
          // so that a budget refusing a later table leaves the earlier ones as they were.
          embedding::PushOptions check;
          check.check_only = true;
          TESSERA_RETURN_IF_ERROR(tables_->PushBatch(batch.pushes, step, check));
        }
        thread_local std::vector<int64_t> unique;
        thread_local std::vector<int32_t> inverse;
        absl::Status partly;
        for (size_t i = done->size(); i < batch.pushes.size(); ++i) {
          const embedding::TableGradients& part = batch.pushes[i];
          const embedding::PushTag tag{id, static_cast<uint32_t>(i), version};
          if (!id.empty()) {
            // Applied and made durable before this shard restarted (write-through tables
            // keep the record with the rows): answered as then, not applied again.
            if (std::optional<int64_t> rows = tables_->RecordedPush(tag); rows.has_value()) {
              done->push_back(*rows);
              continue;
            }
          }
          absl::Status applied =
              id.empty()
                  ? tables_->PushGradients(part.table, part.ids, part.gradients, step)
                  : tables_->PushGradientsRecorded(part.table, part.ids, part.gradients, step, tag);
          // A part that kept some rows (their results were not finite) has updated the
          // others: it counts as applied, so a repeat does not apply them again.
          TESSERA_RETURN_IF_ERROR(tessera::SetAsidePartlyApplied(std::move(applied), &partly));
          embedding::Unique(part.ids, &unique, &inverse);
          done->push_back(static_cast<int64_t>(unique.size()));
          if (i < batch.counters.size() && batch.counters[i] != nullptr) {
            batch.counters[i]->updates += static_cast<int64_t>(unique.size());
          }
        }
        return partly;
      },
      table_of);
  // Applied, in part or whole, or not at all: a reshard's copy sends these rows again.
  for (size_t i = 0; i < batch.pushes.size(); ++i) {
    if (!noting_.load()) break;
    if (i < batch.configs.size()) {
      NoteChanged(batch.configs[i], batch.pushes[i].ids);
    } else if (absl::StatusOr<v1::TableConfig> c = Config(batch.pushes[i].table); c.ok()) {
      NoteChanged(*c, batch.pushes[i].ids);
    }
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> updated, std::move(result));
  if (updated.size() != batch.pushes.size()) return ReusedRequestId(request, batch.pushes.size());
  for (size_t i = 0; filtered && i < updated.size() && i < skipped.size(); ++i) {
    updated[i] += skipped[i];
  }
  return updated;
}

embedding::RequestId ShardService::JournalId(const embedding::RequestId& id) const {
  return JournalIdAt(id, version_.load());
}

absl::Status ShardService::KeepMovedPushes() {
  return Annotate(tables_->KeepServerState(kMovedPushesKey, moved_.Serialized()),
                  absl::StrCat("shard ", index_.load(), ": the pushes of earlier maps not kept"));
}

bool ShardService::WithoutMovedPushes(const DecodedBatch& batch, const embedding::RequestId& id,
                                      DecodedBatch* kept, std::vector<int64_t>* skipped) const {
  if (id.empty() || moved_.empty()) return false;
  const std::vector<v1::AppliedPush> applied = moved_.Of(id);
  if (applied.empty()) return false;
  const size_t n = batch.pushes.size();
  kept->configs = batch.configs;
  kept->counters = batch.counters;
  kept->id_copies.assign(n, {});
  kept->float_copies.assign(n, {});
  skipped->assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const embedding::TableGradients& part = batch.pushes[i];
    absl::StatusOr<v1::TableConfig> config = i < batch.configs.size()
                                                 ? absl::StatusOr<v1::TableConfig>(batch.configs[i])
                                                 : Config(part.table);
    std::vector<int64_t>& ids = kept->id_copies[i];
    std::vector<float>& gradients = kept->float_copies[i];
    const size_t dim = part.ids.empty() ? 0 : part.gradients.size() / part.ids.size();
    absl::flat_hash_set<int64_t> left_out;
    for (size_t j = 0; j < part.ids.size(); ++j) {
      const int64_t row = part.ids[j];
      // A table unknown here keeps its ids: the push refuses it as it would have.
      const bool done =
          config.ok() && std::any_of(applied.begin(), applied.end(), [&](const v1::AppliedPush& a) {
            return AppliedTo(a, *config, row);
          });
      if (done) {
        left_out.insert(row);
        continue;
      }
      ids.push_back(row);
      gradients.insert(gradients.end(), part.gradients.begin() + j * dim,
                       part.gradients.begin() + (j + 1) * dim);
    }
    (*skipped)[i] = static_cast<int64_t>(left_out.size());
  }
  kept->pushes.clear();
  kept->total_ids = 0;
  for (size_t i = 0; i < n; ++i) {
    kept->pushes.push_back(embedding::TableGradients{batch.pushes[i].table, kept->id_copies[i],
                                                     kept->float_copies[i]});
    kept->total_ids += static_cast<int64_t>(kept->id_copies[i].size());
  }
  return true;
}

absl::Status ShardService::ApplyWhole(const DecodedBatch& batch, int64_t step,
                                      const embedding::PushTag& first, std::vector<int64_t>* done) {
  embedding::PushOptions options;
  options.rows_updated = done;
  options.request_id = first.request;  // a collection that records pushes records them
  options.map_version = first.map_version;
  absl::Status s = tables_->PushBatch(batch.pushes, step, options);
  // Refused whole (nothing applied, nothing noted), or applied: a part that kept some rows
  // has updated the others, so the push counts as applied and a repeat is not.
  if (!s.ok() && !tessera::IsPartlyApplied(s)) {
    done->clear();
    return s;
  }
  TESSERA_DCHECK(done->size() == batch.pushes.size());
  for (size_t i = 0; i < done->size() && i < batch.counters.size(); ++i) {
    if (batch.counters[i] != nullptr) batch.counters[i]->updates += (*done)[i];
  }
  return s;
}

grpc::Status ShardService::PushGradients(grpc::ServerContext* context,
                                         const v1::PushGradientsRequest* request,
                                         v1::PushGradientsResponse* response) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(Enter(Traffic::kPush, request->shard_map_version(), *context));
    Admitted admitted(this, Traffic::kPush);
    std::shared_ptr<TableCounters> counters;
    TESSERA_ASSIGN_OR_RETURN(v1::TableConfig config, Config(request->table(), &counters));
    TESSERA_RETURN_IF_ERROR(CheckBatch(absl::StrCat("table '", request->table(), "'"),
                                       request->ids_size(), request->shard_map_version()));
    const absl::Span<const int64_t> ids(request->ids().data(), request->ids_size());
    TESSERA_RETURN_IF_ERROR(CheckOwnership(config, ids));
    thread_local DecodedBatch batch;
    batch.counters.assign(1, std::move(counters));
    batch.pushes.assign(
        1, {request->table(), ids,
            absl::MakeConstSpan(request->gradients().data(), request->gradients_size())});
    TESSERA_RETURN_IF_ERROR(embedding::CheckRowsSize(
        request->table(), "gradients", request->gradients_size(), ids.size(), config.dim(), "ids"));
    TESSERA_ASSIGN_OR_RETURN(
        std::vector<int64_t> updated,
        ApplyPush(batch, request->step(), wire::RequestIdOf(request->request_id())));
    response->set_rows_updated(updated[0]);
    response->set_incarnation(incarnation_);
    return absl::OkStatus();
  });
}

struct ShardService::PushCall {
  grpc::ServerContextBase* context = nullptr;
  const v1::BatchPushRequest* request = nullptr;
  v1::BatchPushResponse* response = nullptr;
  std::function<void(const grpc::Status&)> finish;  // sends the answer; called once
  DecodedBatch batch;
  std::optional<Admitted> admitted;  // from Enter until the answer
  Contribution part;                 // a sync-group push's, while it waits in its step
};

// One BatchPush on the callback API: it lives until gRPC is done with the call.
class ShardService::PushReactor : public grpc::ServerUnaryReactor {
 public:
  PushReactor(ShardService* service, grpc::CallbackServerContext* context,
              const v1::BatchPushRequest* request, v1::BatchPushResponse* response)
      : service_(service) {
    call_.context = context;
    call_.request = request;
    call_.response = response;
    call_.finish = [this](const grpc::Status& status) { Finish(status); };
  }
  PushCall* call() { return &call_; }
  // The caller gave up (its deadline, or it went away) or the server is stopping: a push
  // waiting in its step leaves it, answered CANCELLED (its part would not be applied).
  void OnCancel() override { service_->steps_.Cancel(&call_.part); }
  void OnDone() override { delete this; }

 private:
  ShardService* const service_;
  PushCall call_;
};

grpc::Status ShardService::RegisterSyncGroup(grpc::ServerContext* context,
                                             const v1::RegisterSyncGroupRequest* request,
                                             v1::RegisterSyncGroupResponse* /*response*/) {
  return Serve(context, Access::kWrite, [&] {
    return groups_.Register(request->group().job(), request->group().workers());
  });
}

grpc::ServerUnaryReactor* ShardService::BatchPush(grpc::CallbackServerContext* context,
                                                  const v1::BatchPushRequest* request,
                                                  v1::BatchPushResponse* response) {
  auto* reactor = new PushReactor(this, context, request, response);
  calls_.Schedule([this, call = reactor->call()] { RunBatchPush(call); });
  return reactor;
}

grpc::Status ShardService::BatchPushNow(grpc::ServerContextBase* context,
                                        const v1::BatchPushRequest& request,
                                        v1::BatchPushResponse* response) {
  struct Answered {
    absl::Notification done;
    grpc::Status status;
  };
  auto answered = std::make_shared<Answered>();
  PushCall call;
  call.context = context;
  call.request = &request;
  call.response = response;
  call.finish = [answered](const grpc::Status& status) {
    const std::shared_ptr<Answered> keep = answered;  // past Notify, whoever returns first
    keep->status = status;
    keep->done.Notify();
  };
  RunBatchPush(&call);
  answered->done.WaitForNotification();
  return answered->status;
}

void ShardService::RunBatchPush(PushCall* call) {
  call->context->AddTrailingMetadata(wire::kIncarnationMetadata, absl::StrCat(incarnation_));
  call->context->AddTrailingMetadata(wire::kStorageMetadata, options_.data_dir ? "disk" : "memory");
  if (grpc::Status denied = options_.auth.Check(*call->context, Access::kWrite); !denied.ok()) {
    return call->finish(denied);
  }
  absl::Status s = AdmitBatchPush(call);
  const v1::BatchPushRequest& request = *call->request;
  const bool sync = request.has_sync() && request.sync().workers() > 1;
  if (s.ok() && sync && !request.check_only()) return StartSyncPush(call);
  if (s.ok()) s = CheckOrApplyPush(call);
  Answer(call, s);
}

absl::Status ShardService::AdmitBatchPush(PushCall* call) {
  const v1::BatchPushRequest& request = *call->request;
  // A check round changes no row's value: it waits and counts as a lookup does.
  const Traffic traffic = request.check_only() ? Traffic::kRead : Traffic::kPush;
  TESSERA_RETURN_IF_ERROR(Enter(traffic, request.shard_map_version(), *call->context));
  call->admitted.emplace(this, traffic);
  DecodedBatch& batch = call->batch;
  TESSERA_RETURN_IF_ERROR(PrepareBatchPush(request, Configs(), &batch));
  TESSERA_RETURN_IF_ERROR(CheckBatch("batched push", batch.total_ids, request.shard_map_version()));
  for (size_t i = 0; i < batch.pushes.size(); ++i) {
    TESSERA_RETURN_IF_ERROR(CheckOwnership(batch.configs[i], batch.pushes[i].ids));
  }
  return absl::OkStatus();
}

absl::Status ShardService::CheckOrApplyPush(PushCall* call) {
  const v1::BatchPushRequest& request = *call->request;
  const DecodedBatch& batch = call->batch;
  if (request.check_only()) {
    embedding::PushOptions check;
    check.check_only = true;
    TESSERA_RETURN_IF_ERROR(tables_->PushBatch(batch.pushes, request.step(), check));
    call->response->mutable_rows_updated()->Resize(static_cast<int>(batch.pushes.size()), 0);
    return absl::OkStatus();
  }
  TESSERA_ASSIGN_OR_RETURN(
      std::vector<int64_t> updated,
      ApplyPush(batch, request.step(), wire::RequestIdOf(request.request_id())));
  for (const int64_t u : updated) call->response->add_rows_updated(u);
  return absl::OkStatus();
}

void ShardService::Answer(PushCall* call, const absl::Status& status) {
  if (status.ok()) call->response->set_incarnation(incarnation_);
  call->admitted.reset();                    // out of the reshard gate before the caller hears
  call->finish(wire::ToGrpcStatus(status));  // (may delete `call`)
}

void ShardService::StartSyncPush(PushCall* call) {
  const v1::BatchPushRequest& request = *call->request;
  embedding::PushSync member = wire::PushSyncOf(request);
  member.timeout = std::min(member.timeout, options_.max_sync_wait);
  if (member.job.empty() || member.job.size() > 256) {
    return Answer(call, absl::InvalidArgumentError("sync push: job must be 1-256 bytes"));
  }
  // A group no job registered is refused before it can hold anything.
  if (absl::Status s = groups_.Check(member.job, member.workers); !s.ok()) return Answer(call, s);
  const embedding::RequestId id = wire::RequestIdOf(request.request_id());
  call->part = Contribution{call->batch.pushes, id};
  // The journal answers a repeat of this worker's push; one more part than the tables
  // marks the contribution made (a worker with no ids here still takes part in the step).
  const size_t parts = call->batch.pushes.size();
  const embedding::RequestId journal_id = JournalId(id);
  PushJournal::Claim claim = journal_.Begin(journal_id);
  if (claim.state == PushJournal::Began::kBusy) {
    return Answer(call, absl::UnavailableError(absl::StrCat(
                            "job '", member.job, "' step ", request.step(), ": push ", id.client_id,
                            ":", id.sequence,
                            " is waiting for the step's other workers already (an earlier "
                            "attempt); retry it")));
  }
  if (claim.state == PushJournal::Began::kDone) {
    if (claim.done.size() != parts + 1) return Answer(call, ReusedRequestId(id, parts));
    for (size_t i = 0; i < parts; ++i) call->response->add_rows_updated(claim.done[i]);
    return Answer(call, absl::OkStatus());
  }
  const int64_t step = request.step();
  steps_.Start(
      member, step, &call->part,
      [this, step](absl::Span<const embedding::TableGradients> merged,
                   const embedding::RequestId& first) {
        return ApplyMergedPush(merged, step, first);
      },
      [this, call, journal_id, parts](absl::StatusOr<std::vector<int64_t>> rows) {
        std::vector<int64_t> done;
        if (rows.ok()) {
          done = *rows;
          done.push_back(0);
          for (size_t i = 0; i < parts && i < rows->size(); ++i) {
            call->response->add_rows_updated((*rows)[i]);
          }
        }
        journal_.End(journal_id, rows.status(), std::move(done));
        Answer(call, rows.status());
      });
}

absl::StatusOr<std::vector<int64_t>> ShardService::ApplyMergedPush(
    absl::Span<const embedding::TableGradients> merged, int64_t step,
    const embedding::RequestId& first) {
  // Under an id of its own, derived from the first worker's: a retry of the whole step
  // (every worker's push again, after this shard restarted) finds it applied.
  embedding::RequestId id = first;
  if (!id.empty()) id.client_id ^= 0x5a17c0de5a17c0deULL;
  if (id.client_id == 0) id.client_id = 1;
  DecodedBatch batch;
  batch.pushes.assign(merged.begin(), merged.end());
  batch.counters.resize(merged.size());
  for (size_t i = 0; i < merged.size(); ++i) {
    // A table dropped meanwhile has no counters; its part is refused as NotFound below.
    if (!Config(merged[i].table, &batch.counters[i]).ok()) batch.counters[i] = nullptr;
  }
  return ApplyPush(batch, step, id);
}

}  // namespace tessera::server
