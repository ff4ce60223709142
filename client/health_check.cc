#include "client/health_check.h"

#include <chrono>

#include "client/channel_policy.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "wire/grpc_status.h"

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

absl::StatusOr<bool> IsServing(const std::string& address, const wire::ClientSecurity& security,
                               std::chrono::milliseconds deadline) {
  grpc::ChannelArguments args = ChannelArgs();
  auto credentials = wire::MakeChannelCredentials(security, &args);
  auto health =
      grpc::health::v1::Health::NewStub(grpc::CreateCustomChannel(address, credentials, args));
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = health->Check(wire::NewCallContext(security, deadline).get(), {}, &resp);
  if (!s.ok()) return wire::FromGrpcStatus(s);
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

}  // namespace tessera::client
