#ifndef TESSERA_SERVING_SERVING_SERVICE_H_
#define TESSERA_SERVING_SERVING_SERVICE_H_

#include <chrono>
#include <cstdint>

#include "server/auth.h"
#include "server/lookup_request.h"
#include "serving/replica.h"
#include "tessera/v1/serving.grpc.pb.h"

namespace tessera::serving {

struct ServingServiceOptions {
  int64_t max_batch_ids = 1 << 20;  // ids (or bags) a request answers; more: RESOURCE_EXHAUSTED
  server::CallAuthorizer auth;      // the token each call must carry (default: none)
};

// The Serving gRPC service of tessera-serve over one Replica: the training API's lookups,
// read-only, Predict and Status. Converts and maps statuses; the replica does the rest.
// Thread-safe.
class ServingService final : public v1::Serving::Service {
 public:
  // `replica` must outlive the service.
  ServingService(const Replica* replica, const ServingServiceOptions& options);

  grpc::Status Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                      v1::LookupResponse* response) override;
  grpc::Status BatchLookup(grpc::ServerContext* context, const v1::BatchLookupRequest* request,
                           v1::BatchLookupResponse* response) override;
  grpc::Status Predict(grpc::ServerContext* context, const v1::PredictRequest* request,
                       v1::PredictResponse* response) override;
  grpc::Status Status(grpc::ServerContext* context, const v1::ServingStatusRequest* request,
                      v1::ServingStatusResponse* response) override;

  // The replica's status, as Status answers it (also for the metrics and readiness).
  static void StatusOf(const Replica& replica, v1::ServingStatusResponse* out);

 private:
  server::AnswerLimit Limit() const {
    return {options_.max_batch_ids, "tessera-serve --max_batch_ids"};
  }
  // The table `name` the replica serves, or NotFound naming the model.
  absl::StatusOr<std::shared_ptr<const embedding::ServingTable>> Table(
      const std::string& name) const;

  const Replica* const replica_;
  const ServingServiceOptions options_;
};

}  // namespace tessera::serving

#endif  // TESSERA_SERVING_SERVING_SERVICE_H_
