#include "serving/serving_service.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "embedding/batch_ops.h"
#include "serving/dense_model.h"
#include "wire/packed_bytes.h"

namespace tessera::serving {

ServingService::ServingService(const Replica* replica, const ServingServiceOptions& options)
    : replica_(replica), options_(options) {}

absl::StatusOr<std::shared_ptr<const embedding::ServingTable>> ServingService::Table(
    const std::string& name) const {
  std::shared_ptr<const embedding::ServingTable> table = replica_->table(name);
  if (table == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("table '", name, "' is not served here (model '", replica_->model(), "')"));
  }
  return table;
}

grpc::Status ServingService::Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                                    v1::LookupResponse* response) {
  return server::ServeCall(options_.auth, *context, server::Access::kRead, [&]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<const embedding::ServingTable> table,
                             Table(request->table()));
    TESSERA_ASSIGN_OR_RETURN(server::LookupView view,
                             server::PrepareLookup(*request, table->dim(), Limit(), response));
    embedding::TableBags bags;
    bags.ids = view.ids;
    bags.offsets = view.offsets;
    bags.weights = view.weights;
    bags.pooling = request->pooling();
    bags.out = view.out;
    return LookupRows(*table, bags);
  });
}

grpc::Status ServingService::BatchLookup(grpc::ServerContext* context,
                                         const v1::BatchLookupRequest* request,
                                         v1::BatchLookupResponse* response) {
  return server::ServeCall(options_.auth, *context, server::Access::kRead, [&]() -> absl::Status {
    auto config =
        [&](const std::string& name,
            std::shared_ptr<server::TableCounters>*) -> absl::StatusOr<server::ConfigRef> {
      TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<const embedding::ServingTable> table, Table(name));
      return server::ConfigRef(table, &table->config());  // the table's own, kept with it
    };
    server::DecodedBatch batch;
    TESSERA_RETURN_IF_ERROR(
        server::PrepareBatchLookup(*request, config, Limit(), response, &batch));
    for (const embedding::TableBags& bags : batch.lookups) {
      TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<const embedding::ServingTable> table,
                               Table(bags.table));
      TESSERA_RETURN_IF_ERROR(LookupRows(*table, bags));
    }
    return absl::OkStatus();
  });
}

grpc::Status ServingService::Predict(grpc::ServerContext* context,
                                     const v1::PredictRequest* request,
                                     v1::PredictResponse* response) {
  return server::ServeCall(options_.auth, *context, server::Access::kRead, [&]() -> absl::Status {
    std::vector<float> dense_copy;
    TESSERA_ASSIGN_OR_RETURN(absl::Span<const float> dense,
                             wire::PackedSpan<float>(request->dense(), "dense", &dense_copy));
    std::vector<std::vector<int64_t>> id_copies(request->features_size());
    std::vector<std::vector<int32_t>> offset_copies(request->features_size());
    std::vector<FeatureBags> features;
    int64_t ids = 0;
    for (int f = 0; f < request->features_size(); ++f) {
      const v1::TableLookup& feature = request->features(f);
      const std::string what = absl::StrCat("feature ", f);
      FeatureBags& bags = features.emplace_back();
      TESSERA_ASSIGN_OR_RETURN(bags.ids,
                               wire::PackedSpan<int64_t>(feature.ids(), what, &id_copies[f]));
      TESSERA_ASSIGN_OR_RETURN(
          bags.offsets, wire::PackedSpan<int32_t>(feature.offsets(), what, &offset_copies[f]));
      ids += static_cast<int64_t>(bags.ids.size());
    }
    TESSERA_RETURN_IF_ERROR(server::CheckRequest(
        "Predict", std::max<int64_t>(ids, request->samples()), Limit(), 0, "tessera-serve", 0));
    TESSERA_ASSIGN_OR_RETURN(Replica::Prediction p,
                             replica_->Predict(request->samples(), dense, features));
    wire::SetPacked<float>(p.scores, response->mutable_scores());
    wire::SetPacked<float>(p.logits, response->mutable_logits());
    response->set_dense_step(p.dense_step);
    response->set_serving_step(p.serving_step);
    return absl::OkStatus();
  });
}

void ServingService::StatusOf(const Replica& replica, v1::ServingStatusResponse* out) {
  out->set_model(replica.model());
  out->set_serving_step(replica.serving_step());
  out->set_dense_step(replica.dense_step());
  out->set_head_step(replica.head_step());
  out->set_shards(replica.shards());
  out->set_shards_caught_up(replica.shards_caught_up());
  out->set_seconds_since_caught_up(replica.seconds_since_caught_up());
  for (const std::string& name : replica.tables()) {
    std::shared_ptr<const embedding::ServingTable> table = replica.table(name);
    if (table == nullptr) continue;
    v1::ServingTableStatus* t = out->add_tables();
    t->set_table(name);
    t->set_rows(table->rows());
    t->set_bytes(table->memory_bytes());
    t->set_format(embedding::ServingFormatName(table->format()));
  }
  const ReplicaCounters counters = replica.counters();
  out->set_snapshots(counters.snapshots);
  out->set_rows_applied(counters.rows_applied);
  out->set_bytes_read(counters.bytes_read);
  for (const std::string& e : replica.events()) out->add_events(e);
  out->set_frozen(replica.frozen_step().has_value());
}

grpc::Status ServingService::Status(grpc::ServerContext* context, const v1::ServingStatusRequest*,
                                    v1::ServingStatusResponse* response) {
  return server::ServeCall(options_.auth, *context, server::Access::kRead, [&]() -> absl::Status {
    StatusOf(*replica_, response);
    return absl::OkStatus();
  });
}

}  // namespace tessera::serving
