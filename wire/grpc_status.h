#ifndef TESSERA_WIRE_GRPC_STATUS_H_
#define TESSERA_WIRE_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace tessera::wire {

// The one mapping between absl::Status and grpc::Status, each way: same code, same message
// (absl's and gRPC's codes share their numbering, 0..16). Payloads do not travel.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace tessera::wire

#endif  // TESSERA_WIRE_GRPC_STATUS_H_
