#ifndef TESSERA_SERVER_AUTH_H_
#define TESSERA_SERVER_AUTH_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "wire/grpc_status.h"

namespace tessera::server {

// What a server asks of its callers. The default is an open plaintext server, which is
// what a loopback-only cluster needs; anything listening beyond loopback should set a
// token, TLS or both.
struct ServerSecurity {
  std::string cert_chain;   // PEM certificate of this server; empty: plaintext
  std::string private_key;  // PEM key of cert_chain
  // PEM CA certificates client certificates must chain to; set: mutual TLS, a client
  // without a valid certificate is refused during the handshake.
  std::string client_ca;
  std::string token;            // grants every call; empty: no token is asked for
  std::string read_only_token;  // grants lookups and reads only (needs `token` too)
};

// From the shared flags (wire/security_flags.h) plus --read_only_token_file and
// --tls_require_client_cert. InvalidArgument naming a bad file or combination.
absl::StatusOr<ServerSecurity> ServerSecurityFromFlags();

// TLS server credentials for `security`, or plaintext ones.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const ServerSecurity& security);

// What a call does: reads (lookups, listings, stats) or writes (table creation, pushes,
// checkpoints, restores).
enum class Access { kRead, kWrite };

// Checks the token of each call against the server's: OK without a configured token;
// UNAUTHENTICATED for a call without one or with a wrong one; PERMISSION_DENIED for the
// read-only token on a write. Compares in constant time. Thread-safe.
class CallAuthorizer {
 public:
  CallAuthorizer() = default;  // open: every call passes
  explicit CallAuthorizer(const ServerSecurity& security);

  grpc::Status Check(const grpc::ServerContextBase& context, Access access) const;

 private:
  std::string token_;
  std::string read_only_token_;
};

// Every RPC handler's shape: checks the call's token for `access`, then runs `handler`
// (returning absl::Status) and maps its status to the wire.
template <typename Handler>
grpc::Status ServeCall(const CallAuthorizer& auth, const grpc::ServerContextBase& context,
                       Access access, const Handler& handler) {
  if (grpc::Status denied = auth.Check(context, access); !denied.ok()) return denied;
  return wire::ToGrpcStatus(handler());
}

}  // namespace tessera::server

#endif  // TESSERA_SERVER_AUTH_H_
