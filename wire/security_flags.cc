#include "wire/security_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_ca_file, "",
          "PEM CA certificate(s) that signed the servers' certificates; set: TLS to servers "
          "(servers: the CA their clients' certificates must chain to)");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate of this process: a server's own, or a client's for mutual TLS");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file");
ABSL_FLAG(std::string, tls_server_name, "",
          "name the servers' certificates must carry; empty: the host called");
ABSL_FLAG(std::string, token_file, "",
          "file whose first line is the access token: sent with every call (servers: the "
          "token that grants full access)");

namespace tessera::wire {

absl::StatusOr<ClientSecurity> ClientSecurityFromFlags() {
  ClientSecurityFiles files;
  files.ca_file = absl::GetFlag(FLAGS_tls_ca_file);
  // A client presents its certificate only where the CA is given (TLS at all).
  if (!files.ca_file.empty()) {
    files.cert_file = absl::GetFlag(FLAGS_tls_cert_file);
    files.key_file = absl::GetFlag(FLAGS_tls_key_file);
  }
  files.token_file = absl::GetFlag(FLAGS_token_file);
  files.server_name = absl::GetFlag(FLAGS_tls_server_name);
  return LoadClientSecurity(files);
}

}  // namespace tessera::wire
