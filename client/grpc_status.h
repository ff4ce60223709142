#ifndef TESSERA_CLIENT_GRPC_STATUS_H_
#define TESSERA_CLIENT_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "client/security.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace tessera::client {

// The one grpc::Status -> absl::Status mapping: same code, same message (absl's and gRPC's
// codes share their numbering, 0..16). Its inverse is server::ToGrpcStatus.
inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// `status` of a first call to the coordinator at `address`, with what the usual causes
// are: UNIMPLEMENTED from a server that is not a coordinator (a shard), UNAVAILABLE from
// a TLS server called in plaintext or the other way round.
inline absl::Status ExplainCoordinatorFailure(const absl::Status& status,
                                              absl::string_view address,
                                              const ClientSecurity& security) {
  if (absl::IsUnimplemented(status)) {
    return absl::FailedPreconditionError(absl::StrCat(
        address, " does not serve the tessera.v1.Coordinator API: is it a tessera-shard? "
        "--coordinator takes the coordinator's host:port"));
  }
  if (absl::IsUnavailable(status)) {
    const char* hint =
        !security.tls()
            ? " (this client is plaintext: if the server uses TLS, pass --tls_ca_file)"
        : security.cert_chain.empty()
            ? " (this client uses TLS without a client certificate: a server started with "
              "--tls_require_client_cert refuses it, pass --tls_cert_file and "
              "--tls_key_file; else check that --tls_ca_file signed the server's certificate "
              "and that the server uses TLS)"
            : " (this client uses TLS: check that --tls_ca_file signed the server's "
              "certificate, that the server trusts this client's, and that the server uses "
              "TLS)";
    return absl::Status(status.code(), absl::StrCat(status.message(), hint));
  }
  return status;
}

// "NOT_FOUND", ...: gRPC's codes are the canonical codes absl names.
inline std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace tessera::client

#endif  // TESSERA_CLIENT_GRPC_STATUS_H_
