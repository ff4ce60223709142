#ifndef TESSERA_TESTS_SUPPORT_LOCAL_SERVER_H_
#define TESSERA_TESTS_SUPPORT_LOCAL_SERVER_H_

#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"

namespace tessera::testing {

class AnswerLoser;

// A plaintext gRPC server in this process for `service` on 127.0.0.1, with gRPC's default
// health service on (a router's health checks ask it). `*port`: the port to listen on, 0
// for a free one; set to the port bound. Null when it cannot listen.
// `loser` (may be null): loses or refuses the server's answers (answer_loser.h).
std::unique_ptr<grpc::Server> StartLocalServer(grpc::Service* service, int* port,
                                               AnswerLoser* loser = nullptr);

// "127.0.0.1:PORT".
std::string LocalAddress(int port);

// An insecure channel to 127.0.0.1:`port`.
std::shared_ptr<grpc::Channel> LocalChannel(int port);

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_SUPPORT_LOCAL_SERVER_H_
