#ifndef TESSERA_SERVER_STATUS_H_
#define TESSERA_SERVER_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace tessera::server {

// The one absl::Status -> grpc::Status mapping: same code, same message.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace tessera::server

#endif  // TESSERA_SERVER_STATUS_H_
