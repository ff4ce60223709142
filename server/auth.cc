#include "server/auth.h"

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "wire/security_flags.h"

ABSL_FLAG(std::string, read_only_token_file, "",
          "file whose first line is a token that grants lookups and reads only");
ABSL_FLAG(bool, tls_require_client_cert, false,
          "mutual TLS: refuse clients without a certificate chaining to --tls_ca_file");

namespace tessera::server {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

// Equal strings, in time that depends on the lengths only.
bool SameSecret(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::StatusOr<ServerSecurity> ServerSecurityFromFlags() {
  ServerSecurity s;
  const std::string cert = absl::GetFlag(FLAGS_tls_cert_file);
  const std::string key = absl::GetFlag(FLAGS_tls_key_file);
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls_cert_file and --tls_key_file");
  }
  if (!cert.empty()) {
    TESSERA_ASSIGN_OR_RETURN(s.cert_chain, wire::ReadSecret(cert, "certificate file"));
    TESSERA_ASSIGN_OR_RETURN(s.private_key, wire::ReadSecret(key, "key file"));
  }
  if (absl::GetFlag(FLAGS_tls_require_client_cert)) {
    const std::string ca = absl::GetFlag(FLAGS_tls_ca_file);
    if (cert.empty() || ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls_require_client_cert needs --tls_cert_file, --tls_key_file and --tls_ca_file");
    }
    TESSERA_ASSIGN_OR_RETURN(s.client_ca, wire::ReadSecret(ca, "CA file"));
  }
  if (!absl::GetFlag(FLAGS_token_file).empty()) {
    TESSERA_ASSIGN_OR_RETURN(s.token, wire::ReadToken(absl::GetFlag(FLAGS_token_file)));
  }
  if (!absl::GetFlag(FLAGS_read_only_token_file).empty()) {
    if (s.token.empty()) {
      return absl::InvalidArgumentError(
          "--read_only_token_file needs --token_file: without a token every call is open");
    }
    TESSERA_ASSIGN_OR_RETURN(s.read_only_token,
                             wire::ReadToken(absl::GetFlag(FLAGS_read_only_token_file)));
    if (s.read_only_token == s.token) {
      return absl::InvalidArgumentError("the read-only token must differ from the full token");
    }
  }
  return s;
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const ServerSecurity& security) {
  if (security.cert_chain.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(
      security.client_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                 : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = security.client_ca;
  ssl.pem_key_cert_pairs.push_back({security.private_key, security.cert_chain});
  return grpc::SslServerCredentials(ssl);
}

CallAuthorizer::CallAuthorizer(const ServerSecurity& security)
    : token_(security.token), read_only_token_(security.read_only_token) {}

grpc::Status CallAuthorizer::Check(const grpc::ServerContextBase& context, Access access) const {
  if (token_.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this server needs a token: send 'authorization: Bearer <token>'");
  }
  const absl::string_view value(it->second.data(), it->second.size());
  if (!absl::StartsWith(value, kBearer)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "the authorization header must be 'Bearer <token>'");
  }
  const absl::string_view presented = value.substr(kBearer.size());
  if (SameSecret(presented, token_)) return grpc::Status::OK;
  if (!read_only_token_.empty() && SameSecret(presented, read_only_token_)) {
    if (access == Access::kRead) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "the read-only token grants lookups and reads only");
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong token");
}

}  // namespace tessera::server
