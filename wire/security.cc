#include "wire/security.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/status.h"

namespace tessera::wire {

absl::StatusOr<std::string> ReadSecret(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read the ", what, " ", path));
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the ", what, " ", path, " is empty"));
  }
  return text.str();
}

absl::StatusOr<std::string> ReadToken(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(std::string text, ReadSecret(path, "token file"));
  std::string token(absl::StripAsciiWhitespace(text.substr(0, text.find('\n'))));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the token file ", path, " has an empty first line"));
  }
  return token;
}

absl::StatusOr<ClientSecurity> LoadClientSecurity(const ClientSecurityFiles& files) {
  ClientSecurity s;
  s.server_name = files.server_name;
  if (files.cert_file.empty() != files.key_file.empty()) {
    return absl::InvalidArgumentError(
        "a client certificate needs both a certificate file and a key file");
  }
  if (!files.cert_file.empty() && files.ca_file.empty()) {
    return absl::InvalidArgumentError("a client certificate needs TLS: give the CA file too");
  }
  if (!files.ca_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(s.root_certs, ReadSecret(files.ca_file, "CA file"));
  }
  if (!files.cert_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(s.cert_chain, ReadSecret(files.cert_file, "certificate file"));
    TESSERA_ASSIGN_OR_RETURN(s.private_key, ReadSecret(files.key_file, "key file"));
  }
  if (!files.token_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(s.token, ReadToken(files.token_file));
  }
  return s;
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const ClientSecurity& security,
                                                                 grpc::ChannelArguments* args) {
  if (!security.tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = security.root_certs;
  ssl.pem_cert_chain = security.cert_chain;
  ssl.pem_private_key = security.private_key;
  if (!security.server_name.empty()) args->SetSslTargetNameOverride(security.server_name);
  return grpc::SslCredentials(ssl);
}

void Authorize(const ClientSecurity& security, grpc::ClientContext* context) {
  if (!security.token.empty()) context->AddMetadata("authorization", "Bearer " + security.token);
}

std::unique_ptr<grpc::ClientContext> NewCallContext(const ClientSecurity& security,
                                                    std::chrono::milliseconds deadline) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + deadline);
  Authorize(security, ctx.get());
  return ctx;
}

absl::Status ExplainCoordinatorFailure(const absl::Status& status, absl::string_view address,
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
    if (absl::StrContains(status.message(), hint)) return status;  // explained already
    return absl::Status(status.code(), absl::StrCat(status.message(), hint));
  }
  return status;
}

}  // namespace tessera::wire
