#include <chrono>
#include <memory>
#include <string>

#include "benchmarks/bench/measures.h"
#include "benchmarks/echo.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace tessera::bench {
namespace {

using Clock = std::chrono::steady_clock;

class EchoService final : public Echo::Service {
  grpc::Status Echo(grpc::ServerContext*, const EchoRequest* req, EchoResponse* resp) override {
    resp->mutable_payload()->resize(req->response_bytes());
    return grpc::Status::OK;
  }
  grpc::Status EchoStream(grpc::ServerContext*,
                          grpc::ServerReaderWriter<EchoResponse, EchoRequest>* stream) override {
    EchoRequest req;
    EchoResponse resp;
    while (stream->Read(&req)) {
      resp.mutable_payload()->resize(req.response_bytes());
      if (!stream->Write(resp)) break;
    }
    return grpc::Status::OK;
  }
};

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

EchoCeiling MeasureEcho(int64_t sent, int64_t received, double seconds) {
  EchoService service;
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.SetMaxReceiveMessageSize(1 << 30);
  b.SetMaxSendMessageSize(1 << 30);
  b.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  EchoCeiling c;
  if (server == nullptr) return c;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetMaxSendMessageSize(1 << 30);
  auto stub = Echo::NewStub(grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                                      grpc::InsecureChannelCredentials(), args));
  EchoRequest req;
  req.mutable_payload()->resize(sent);
  req.set_response_bytes(static_cast<int32_t>(received));
  const double bytes = static_cast<double>(sent + received);
  {
    EchoResponse resp;
    grpc::ClientContext warm;
    (void)stub->Echo(&warm, req, &resp);
    const auto start = Clock::now();
    int64_t calls = 0;
    while (Since(start) < seconds || calls < 3) {
      grpc::ClientContext ctx;
      if (!stub->Echo(&ctx, req, &resp).ok()) break;
      ++calls;
    }
    c.unary_bytes_per_s = calls * bytes / Since(start);
  }
  {
    grpc::ClientContext ctx;
    auto stream = stub->EchoStream(&ctx);
    EchoResponse resp;
    const auto start = Clock::now();
    int64_t calls = 0;
    while (Since(start) < seconds || calls < 3) {
      if (!stream->Write(req) || !stream->Read(&resp)) break;
      ++calls;
    }
    c.stream_bytes_per_s = calls * bytes / Since(start);
    stream->WritesDone();
    (void)stream->Finish();
  }
  server->Shutdown();
  return c;
}

}  // namespace tessera::bench
