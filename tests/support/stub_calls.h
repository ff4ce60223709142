#ifndef TESSERA_TESTS_SUPPORT_STUB_CALLS_H_
#define TESSERA_TESTS_SUPPORT_STUB_CALLS_H_

// One call with a fresh context on a stub that offers the data calls (a shard's
// EmbeddingShard::Stub or the Coordinator::Stub): what the server tests send again and
// again.

#include "grpcpp/grpcpp.h"
#include "tessera/v1/embedding_service.pb.h"

namespace tessera::testing {

template <typename Stub>
grpc::Status CreateTable(Stub& stub, const v1::TableConfig& config) {
  grpc::ClientContext ctx;
  v1::CreateTableRequest req;
  *req.mutable_config() = config;
  v1::CreateTableResponse resp;
  return stub.CreateTable(&ctx, req, &resp);
}

template <typename Stub>
grpc::Status Lookup(Stub& stub, const v1::LookupRequest& req, v1::LookupResponse* resp) {
  grpc::ClientContext ctx;
  return stub.Lookup(&ctx, req, resp);
}

template <typename Stub>
grpc::Status PushGradients(Stub& stub, const v1::PushGradientsRequest& req) {
  grpc::ClientContext ctx;
  v1::PushGradientsResponse resp;
  return stub.PushGradients(&ctx, req, &resp);
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_SUPPORT_STUB_CALLS_H_
