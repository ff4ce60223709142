// Lookups through the coordinator and through the smart client, next to a raw gRPC echo
// of the same payload bytes measured in the same run: `vs_echo` is the lookup's bytes/s
// over the echo's. Everything runs in this process over 127.0.0.1: two shard servers, a
// coordinator and an echo server, each a real gRPC server.
//
// Bytes counted per call: 8 per id sent plus 4 * dim per row received.

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "benchmarks/echo.grpc.pb.h"
#include "client/embedding_client.h"
#include "client/shard_router.h"
#include "embedding/collection.h"
#include "embedding/inprocess_collection.h"
#include "grpcpp/grpcpp.h"
#include "server/coordinator_service.h"
#include "server/shard_service.h"

namespace tessera {
namespace {

constexpr int kShards = 2;
constexpr int64_t kRows = 200000;

class EchoService final : public bench::Echo::Service {
  grpc::Status Echo(grpc::ServerContext*, const bench::EchoRequest* req,
                    bench::EchoResponse* resp) override {
    resp->mutable_payload()->resize(req->response_bytes());
    return grpc::Status::OK;
  }
  grpc::Status EchoStream(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<bench::EchoResponse, bench::EchoRequest>* stream) override {
    bench::EchoRequest req;
    bench::EchoResponse resp;
    while (stream->Read(&req)) {
      resp.mutable_payload()->resize(req.response_bytes());
      if (!stream->Write(resp)) break;
    }
    return grpc::Status::OK;
  }
};

std::unique_ptr<grpc::Server> Serve(grpc::Service* service, std::string* address) {
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.SetMaxReceiveMessageSize(256 << 20);
  b.SetMaxSendMessageSize(256 << 20);
  b.RegisterService(service);
  auto server = b.BuildAndStart();
  *address = "127.0.0.1:" + std::to_string(port);
  return server;
}

// The cluster, built once for the whole run.
struct Cluster {
  Cluster() {
    std::vector<std::string> shard_addresses;
    for (int k = 0; k < kShards; ++k) {
      tables.push_back(std::move(embedding::NewInProcessCollection(1)).value());
      server::ShardOptions o;
      o.shard_index = k;
      o.num_shards = kShards;
      o.max_batch_ids = 1 << 22;
      shard_services.push_back(std::make_unique<server::ShardService>(tables[k].get(), o));
      std::string address;
      servers.push_back(Serve(shard_services[k].get(), &address));
      shard_addresses.push_back(address);
    }
    router = std::make_unique<client::ShardRouter>(shard_addresses, client::RouterOptions());
    server::CoordinatorOptions co;
    co.max_batch_ids = 1 << 22;
    coordinator = std::make_unique<server::CoordinatorService>(router.get(), 1, co);
    std::string coordinator_address;
    servers.push_back(Serve(coordinator.get(), &coordinator_address));
    std::string echo_address;
    servers.push_back(Serve(&echo, &echo_address));
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(256 << 20);
    args.SetMaxSendMessageSize(256 << 20);
    echo_stub = bench::Echo::NewStub(
        grpc::CreateCustomChannel(echo_address, grpc::InsecureChannelCredentials(), args));
    client::ClientOptions smart;
    smart.mode = client::ClientOptions::Mode::kSmart;
    smart_client = std::move(client::EmbeddingClient::Connect(coordinator_address, smart)).value();
    client::ClientOptions via;
    via.mode = client::ClientOptions::Mode::kCoordinator;
    coordinator_client =
        std::move(client::EmbeddingClient::Connect(coordinator_address, via)).value();
    for (int dim : {16, 64}) {
      v1::TableConfig c;
      c.set_name(absl::StrCat("d", dim));
      c.set_dim(dim);
      (void)coordinator_client->CreateTable(c);
      std::vector<int64_t> ids(65536);
      std::vector<float> out(ids.size() * dim);
      for (int64_t begin = 0; begin < kRows; begin += ids.size()) {
        for (size_t i = 0; i < ids.size(); ++i) ids[i] = (begin + i) % kRows;
        (void)smart_client->Lookup(c.name(), ids, absl::MakeSpan(out), {});
      }
    }
  }

  std::vector<std::unique_ptr<embedding::ShardTables>> tables;
  std::vector<std::unique_ptr<server::ShardService>> shard_services;
  std::unique_ptr<client::ShardRouter> router;
  std::unique_ptr<server::CoordinatorService> coordinator;
  EchoService echo;
  std::vector<std::unique_ptr<grpc::Server>> servers;
  std::unique_ptr<bench::Echo::Stub> echo_stub;
  std::unique_ptr<client::EmbeddingClient> smart_client, coordinator_client;
};

Cluster& GetCluster() {
  static Cluster* c = new Cluster();
  return *c;
}

// An echo request of `sent` bytes that asks for `received` bytes back.
bench::EchoRequest EchoRequestOf(int64_t sent, int64_t received) {
  bench::EchoRequest req;
  req.mutable_payload()->resize(sent);
  req.set_response_bytes(static_cast<int32_t>(received));
  return req;
}

// Echo bytes/s for a request of `sent` and a response of `received` bytes, over ~0.3 s.
double EchoBytesPerSecond(int64_t sent, int64_t received) {
  Cluster& c = GetCluster();
  const bench::EchoRequest req = EchoRequestOf(sent, received);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  int64_t calls = 0;
  double seconds = 0;
  while (seconds < 0.3 || calls < 3) {
    grpc::ClientContext ctx;
    bench::EchoResponse resp;
    (void)c.echo_stub->Echo(&ctx, req, &resp);
    ++calls;
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return calls * static_cast<double>(sent + received) / seconds;
}

void RunLookups(benchmark::State& state, bool smart) {
  const int batch = state.range(0);
  const int dim = state.range(1);
  Cluster& c = GetCluster();
  client::EmbeddingClient& client = smart ? *c.smart_client : *c.coordinator_client;
  std::mt19937_64 rng(batch + dim);
  std::vector<int64_t> ids(batch);
  for (auto& id : ids) id = static_cast<int64_t>(rng() % kRows);
  std::vector<float> out(static_cast<size_t>(batch) * dim);
  const int64_t sent = static_cast<int64_t>(batch) * 8;
  const int64_t received = static_cast<int64_t>(batch) * dim * 4;
  const double ceiling = EchoBytesPerSecond(sent, received);
  const std::string table = absl::StrCat("d", dim);
  for (auto _ : state) {
    absl::Status s = client.Lookup(table, ids, absl::MakeSpan(out), {});
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      break;
    }
  }
  state.SetBytesProcessed(state.iterations() * (sent + received));
  state.SetItemsProcessed(state.iterations() * batch);
  state.counters["echo_MBps"] = ceiling / 1e6;
  state.counters["vs_echo"] = benchmark::Counter(static_cast<double>(sent + received) / ceiling,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void BM_SmartClientLookup(benchmark::State& state) { RunLookups(state, true); }
void BM_CoordinatorLookup(benchmark::State& state) { RunLookups(state, false); }

void Args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"batch", "dim"});
  b->ArgsProduct({{512, 4096, 65536}, {16, 64}});
  b->MinTime(0.5)->UseRealTime();
}

BENCHMARK(BM_SmartClientLookup)->Apply(Args);
BENCHMARK(BM_CoordinatorLookup)->Apply(Args);

// One echo round trip of `sent` bytes out and `received` back: a unary call each time
// (what every shard call is), or one message each way on a stream held open (the floor
// without a call's setup). Time per round trip; compare the two at one size.
void BM_EchoUnary(benchmark::State& state) {
  Cluster& c = GetCluster();
  const bench::EchoRequest req = EchoRequestOf(state.range(0), state.range(1));
  for (auto _ : state) {
    grpc::ClientContext ctx;
    bench::EchoResponse resp;
    const grpc::Status s = c.echo_stub->Echo(&ctx, req, &resp);
    if (!s.ok()) {
      state.SkipWithError(s.error_message().c_str());
      break;
    }
  }
}

void BM_EchoStream(benchmark::State& state) {
  Cluster& c = GetCluster();
  const bench::EchoRequest req = EchoRequestOf(state.range(0), state.range(1));
  grpc::ClientContext ctx;
  auto stream = c.echo_stub->EchoStream(&ctx);
  bench::EchoResponse resp;
  for (auto _ : state) {
    if (!stream->Write(req) || !stream->Read(&resp)) {
      state.SkipWithError("the echo stream broke");
      break;
    }
  }
  stream->WritesDone();
  (void)stream->Finish();
}

// A few bytes, and a shard's share of a batch-256 step of the default run (its push and
// lookup ids out, its rows back: about 110 kB and 100 kB).
void EchoArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"sent", "received"});
  b->Args({100, 100})->Args({110000, 100000})->MinTime(0.5)->UseRealTime();
}

BENCHMARK(BM_EchoUnary)->Apply(EchoArgs);
BENCHMARK(BM_EchoStream)->Apply(EchoArgs);

}  // namespace
}  // namespace tessera

// main() is benchmark_main.cc.
