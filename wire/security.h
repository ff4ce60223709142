#ifndef TESSERA_WIRE_SECURITY_H_
#define TESSERA_WIRE_SECURITY_H_

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"

namespace tessera::wire {

// How a client checks the servers it calls and proves who it is. The default is what a
// loopback cluster needs: plaintext, no token.
struct ClientSecurity {
  std::string root_certs;   // PEM CA certificates that signed the servers'; empty: plaintext
  std::string cert_chain;   // PEM client certificate, for servers that require one (mutual TLS)
  std::string private_key;  // PEM key of cert_chain
  // The name the server certificates must carry; empty: the host of the address called.
  std::string server_name;
  std::string token;  // sent with every call as "authorization: Bearer <token>"; empty: none

  bool tls() const { return !root_certs.empty(); }
};

// Files that make a ClientSecurity: `ca_file` (empty: plaintext), `cert_file` and
// `key_file` (both or neither), `token_file` (the token is its first line). InvalidArgument
// naming the file that is missing, unreadable or empty, or a lone cert or key.
struct ClientSecurityFiles {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  std::string token_file;
  std::string server_name;
};
absl::StatusOr<ClientSecurity> LoadClientSecurity(const ClientSecurityFiles& files);

// Channel credentials for `security`: TLS (with the client certificate when given) or
// plaintext. Adds the server-name override to `args` when one is set.
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const ClientSecurity& security,
                                                                 grpc::ChannelArguments* args);

// Attaches the token of `security` (if any) to a call.
void Authorize(const ClientSecurity& security, grpc::ClientContext* context);

// A call's context: its deadline `deadline` from now, authorized as `security` says.
std::unique_ptr<grpc::ClientContext> NewCallContext(const ClientSecurity& security,
                                                    std::chrono::milliseconds deadline);

// Reads a whole PEM or token file; InvalidArgument naming `what` and the path.
absl::StatusOr<std::string> ReadSecret(const std::string& path, const std::string& what);

// The token of a token file: its first line without surrounding blanks. InvalidArgument
// when the file is missing, unreadable or its first line is empty.
absl::StatusOr<std::string> ReadToken(const std::string& path);

// `status` of a first call to the coordinator at `address`, with what the usual causes
// are: UNIMPLEMENTED from a server that is not a coordinator (a shard), UNAVAILABLE from
// a TLS server called in plaintext or the other way round. A status it explained already
// comes back as it is.
absl::Status ExplainCoordinatorFailure(const absl::Status& status, absl::string_view address,
                                       const ClientSecurity& security);

}  // namespace tessera::wire

#endif  // TESSERA_WIRE_SECURITY_H_
