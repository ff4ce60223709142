#ifndef TESSERA_WIRE_SECURITY_FLAGS_H_
#define TESSERA_WIRE_SECURITY_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "wire/security.h"

// TLS and token flags shared by every Tessera binary. In a server they also describe the
// server side: its certificate and key, the CA its clients' certificates must chain to,
// and the token it accepts (see server/auth.h).
ABSL_DECLARE_FLAG(std::string, tls_ca_file);
ABSL_DECLARE_FLAG(std::string, tls_cert_file);
ABSL_DECLARE_FLAG(std::string, tls_key_file);
ABSL_DECLARE_FLAG(std::string, tls_server_name);
ABSL_DECLARE_FLAG(std::string, token_file);

namespace tessera::wire {

// The ClientSecurity the flags above describe; InvalidArgument naming a bad file.
absl::StatusOr<ClientSecurity> ClientSecurityFromFlags();

}  // namespace tessera::wire

#endif  // TESSERA_WIRE_SECURITY_FLAGS_H_
