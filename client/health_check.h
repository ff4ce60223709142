#ifndef TESSERA_CLIENT_HEALTH_CHECK_H_
#define TESSERA_CLIENT_HEALTH_CHECK_H_

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "wire/security.h"

namespace tessera::client {

// Waits (up to `seconds`) until the server at `address` answers its gRPC health check as
// SERVING, over a plaintext channel (a local server: a test's, a benchmark's).
bool WaitHealthy(const std::string& address, int seconds = 10);

// Asks the server at `address` once (TLS and token as `security` says) whether it is
// SERVING; an error when it does not answer within `deadline`.
absl::StatusOr<bool> IsServing(const std::string& address, const wire::ClientSecurity& security,
                               std::chrono::milliseconds deadline);

}  // namespace tessera::client

#endif  // TESSERA_CLIENT_HEALTH_CHECK_H_
