#include "tests/support/local_server.h"

#include <vector>

#include "tessera/v1/embedding_service.grpc.pb.h"
#include "tests/support/answer_loser.h"

namespace tessera::testing {
namespace {

// gRPC serves the callback API (the shard's BatchPush) from one completion queue per
// process, which it tears down when the last server or channel using it goes and builds
// again for the next; that cycle can race its own threads. Tests start and stop servers
// case after case: one server kept for the whole process keeps the queue alive.
void KeepCallbackQueue() {
  static grpc::Server* const kept = [] {
    static auto* const service = new v1::EmbeddingShard::CallbackService();
    grpc::ServerBuilder builder;
    builder.RegisterService(service);
    return builder.BuildAndStart().release();
  }();
  (void)kept;
}

}  // namespace

std::unique_ptr<grpc::Server> StartLocalServer(grpc::Service* service, int* port,
                                               AnswerLoser* loser) {
  KeepCallbackQueue();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(LocalAddress(*port), grpc::InsecureServerCredentials(), port);
  builder.RegisterService(service);
  if (loser != nullptr) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    creators.push_back(loser->Factory());
    builder.experimental().SetInterceptorCreators(std::move(creators));
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (*port == 0) server.reset();
  return server;
}

std::string LocalAddress(int port) { return "127.0.0.1:" + std::to_string(port); }

std::shared_ptr<grpc::Channel> LocalChannel(int port) {
  return grpc::CreateChannel(LocalAddress(port), grpc::InsecureChannelCredentials());
}

}  // namespace tessera::testing
