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

grpc::Status ShardService::PushGradients(grpc::ServerContext* context,
                                         const v1::PushGradientsRequest* request,
                                         v1::PushGradientsResponse* response) {
  return Serve(context, Access::kWrite, [&]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(Enter(Traffic::kPush, request->shard_map_version(), *context));
    Admitted admitted(&reshard_, Traffic::kPush);
    std::shared_ptr<TableCounters> counters;
    TESSERA_ASSIGN_OR_RETURN(v1::TableConfig config, Config(request->table(), &counters));
    TESSERA_RETURN_IF_ERROR(CheckBatch(absl::StrCat("table '", request->table(), "'"),
                                       request->ids_size(), request->shard_map_version()));
    const absl::Span<const int64_t> ids(request->ids().data(), request->ids_size());
    TESSERA_RETURN_IF_ERROR(CheckOwnership(config, ids));
    thread_local DecodedBatch batch;  // every field this push reads is set afresh
    batch.configs.assign(1, std::move(config));
    batch.config_refs.clear();
    batch.counters.assign(1, std::move(counters));
    batch.pushes.assign(
        1, {request->table(), ids,
            absl::MakeConstSpan(request->gradients().data(), request->gradients_size())});
    TESSERA_ASSIGN_OR_RETURN(batch.checked, embedding::CheckPush(batch.configs, batch.pushes));
    TESSERA_ASSIGN_OR_RETURN(
        std::vector<int64_t> updated,
        pushes_.Apply(batch, request->step(), wire::RequestIdOf(request->request_id())));
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
  void OnCancel() override { service_->pushes_.Cancel(&call_.part); }
  void OnDone() override { delete this; }

 private:
  ShardService* const service_;
  PushCall call_;
};

grpc::Status ShardService::RegisterSyncGroup(grpc::ServerContext* context,
                                             const v1::RegisterSyncGroupRequest* request,
                                             v1::RegisterSyncGroupResponse* /*response*/) {
  return Serve(context, Access::kWrite, [&] {
    return pushes_.RegisterGroup(request->group().job(), request->group().workers());
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
  // The thread's last decoded push, whose configs are kept where they are the same
  // (ConfigRef): a step's push names the same tables as the one before.
  thread_local DecodedBatch reused;
  PushCall call;
  call.batch = std::move(reused);
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
  reused = std::move(call.batch);
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
  call->admitted.emplace(&reshard_, traffic);
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
    TESSERA_RETURN_IF_ERROR(pushes_.Check(batch, request.step()));
    call->response->mutable_rows_updated()->Resize(static_cast<int>(batch.pushes.size()), 0);
    return absl::OkStatus();
  }
  TESSERA_ASSIGN_OR_RETURN(
      std::vector<int64_t> updated,
      pushes_.Apply(batch, request.step(), wire::RequestIdOf(request.request_id())));
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
  const embedding::RequestId id = wire::RequestIdOf(request.request_id());
  call->part = Contribution{call->batch.pushes, id};
  pushes_.StartSync(wire::PushSyncOf(request), request.step(), id, &call->part,
                    [this, call](absl::StatusOr<std::vector<int64_t>> rows) {
                      if (rows.ok()) {
                        for (const int64_t r : *rows) call->response->add_rows_updated(r);
                      }
                      Answer(call, rows.status());
                    });
}

}  // namespace tessera::server
