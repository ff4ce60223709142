#ifndef TESSERA_CLIENT_GRPC_STATUS_H_
#define TESSERA_CLIENT_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace tessera::client {

// The one grpc::Status -> absl::Status mapping: same code, same message (absl's and gRPC's
// codes share their numbering, 0..16). Its inverse is server::ToGrpcStatus.
inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// "NOT_FOUND", ...: gRPC's codes are the canonical codes absl names.
inline std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace tessera::client

#endif  // TESSERA_CLIENT_GRPC_STATUS_H_
