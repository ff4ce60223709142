#include "client/health_check.h"

#include <chrono>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace tessera::client {

bool WaitHealthy(const std::string& address, int seconds) {
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_wait_for_ready(true);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  grpc::health::v1::HealthCheckResponse resp;
  return health->Check(&ctx, {}, &resp).ok() &&
         resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

}  // namespace tessera::client
