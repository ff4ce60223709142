#include "tests/support/local_server.h"

#include <vector>

#include "tests/support/answer_loser.h"

namespace tessera::testing {

std::unique_ptr<grpc::Server> StartLocalServer(grpc::Service* service, int* port,
                                               AnswerLoser* loser) {
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
