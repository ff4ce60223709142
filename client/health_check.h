#ifndef TESSERA_CLIENT_HEALTH_CHECK_H_
#define TESSERA_CLIENT_HEALTH_CHECK_H_

#include <string>

namespace tessera::client {

// Waits (up to `seconds`) until the server at `address` answers its gRPC health check as
// SERVING, over a plaintext channel (a local server: a test's, a benchmark's).
bool WaitHealthy(const std::string& address, int seconds = 10);

}  // namespace tessera::client

#endif  // TESSERA_CLIENT_HEALTH_CHECK_H_
