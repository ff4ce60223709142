// The metrics endpoint of a shard server, scraped over HTTP as Prometheus would.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "embedding/collection.h"
#include "embedding/inprocess_collection.h"
#include "gtest/gtest.h"
#include "observability/metrics.h"
#include "server/serving.h"
#include "server/shard_service.h"
#include "tessera/v1/embedding_service.grpc.pb.h"

namespace tessera::server {
namespace {

// GET http://127.0.0.1:port/metrics; the body, or "" on failure.
std::string Scrape(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  const std::string request =
      "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  (void)!::write(fd, request.data(), request.size());
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) response.append(buf, n);
  ::close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// The value of the sample named `name` whose labels include every one of `labels`
// (`key="value"` pieces); -1 when there is none.
double Sample(const std::string& text, const std::string& name,
              const std::vector<std::string>& labels) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, name + "{") && !absl::StartsWith(line, name + " ")) continue;
    bool all = true;
    for (const auto& l : labels) all = all && absl::StrContains(line, l);
    if (!all) continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) return v;
  }
  return -1;
}

TEST(Metrics, AShardServesRpcCountsLatenciesAndTableSizes) {
  auto metrics = observability::Metrics::Start("127.0.0.1", 0, "shard");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  ASSERT_GT((*metrics)->port(), 0);
  auto tables = std::move(embedding::NewInProcessCollection(1)).value();
  ShardService service(tables.get(), ShardOptions());
  ListenOptions listen;
  listen.metrics = metrics->get();
  int port = 0;
  auto server = StartServer(&service, listen, &port);
  ASSERT_TRUE(server.ok());
  auto stub = v1::EmbeddingShard::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));

  v1::CreateTableRequest create;
  create.mutable_config()->set_name("user");
  create.mutable_config()->set_dim(8);
  v1::CreateTableResponse created;
  grpc::ClientContext c0;
  ASSERT_TRUE(stub->CreateTable(&c0, create, &created).ok());
  for (int i = 0; i < 3; ++i) {
    v1::LookupRequest req;
    req.set_table("user");
    for (int id = 0; id < 100; ++id) req.add_ids(id + 1000 * i);
    v1::LookupResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Lookup(&ctx, req, &resp).ok());
  }
  // A table with feature admission: 5 ids pushed once, none admitted (they need 2 steps).
  v1::CreateTableRequest rare;
  rare.mutable_config()->set_name("rare");
  rare.mutable_config()->set_dim(2);
  rare.mutable_config()->mutable_admission()->set_min_count(2);
  grpc::ClientContext c1;
  ASSERT_TRUE(stub->CreateTable(&c1, rare, &created).ok());
  v1::PushGradientsRequest push;
  push.set_table("rare");
  for (int id = 0; id < 5; ++id) {
    push.add_ids(id);
    push.add_gradients(0.5f);
    push.add_gradients(0.5f);
  }
  v1::PushGradientsResponse pushed;
  grpc::ClientContext c2;
  ASSERT_TRUE(stub->PushGradients(&c2, push, &pushed).ok());
  v1::StatsRequest stats_request;
  stats_request.set_table("rare");
  v1::StatsResponse stats;
  grpc::ClientContext c3;
  ASSERT_TRUE(stub->Stats(&c3, stats_request, &stats).ok());
  ASSERT_EQ(stats.tables_size(), 1);
  EXPECT_EQ(stats.tables(0).admission_refused(), 5);
  EXPECT_EQ(stats.tables(0).rows(), 0);
  v1::LookupRequest missing;
  missing.set_table("nope");
  missing.add_ids(1);
  v1::LookupResponse resp;
  grpc::ClientContext ctx;
  EXPECT_EQ(stub->Lookup(&ctx, missing, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  (*metrics)->ReadTables(observability::ReadingsOf(tables.get()));

  // A call leaves the in-flight gauge when gRPC lets go of it, which may be just after
  // the client has its answer: scrape until the last one has left (bounded).
  std::string text;
  for (int i = 0; i < 50; ++i) {
    text = Scrape((*metrics)->port());
    if (Sample(text, "tessera_rpc_in_flight", {}) == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_FALSE(text.empty());
  const std::string lookup = "method=\"EmbeddingShard/Lookup\"";
  EXPECT_EQ(Sample(text, "tessera_rpc_requests_total", {lookup, "code=\"OK\"", "role=\"shard\""}),
            3);
  EXPECT_EQ(Sample(text, "tessera_rpc_requests_total", {lookup, "code=\"NOT_FOUND\""}), 1);
  EXPECT_EQ(Sample(text, "tessera_rpc_requests_total",
                   {"method=\"EmbeddingShard/CreateTable\"", "code=\"OK\""}),
            2);  // user and rare
  EXPECT_EQ(Sample(text, "tessera_rpc_latency_seconds_count", {lookup, "code=\"OK\""}), 3);
  EXPECT_EQ(Sample(text, "tessera_rpc_latency_seconds_count", {lookup, "code=\"NOT_FOUND\""}), 1);
  EXPECT_GT(Sample(text, "tessera_rpc_latency_seconds_sum", {lookup, "code=\"OK\""}), 0);
  EXPECT_EQ(Sample(text, "tessera_rpc_in_flight", {}), 0);
  EXPECT_EQ(Sample(text, "tessera_table_rows", {"table=\"user\""}), 300);
  EXPECT_GT(Sample(text, "tessera_table_bytes", {"table=\"user\""}), 300 * 8 * 4);
  EXPECT_EQ(Sample(text, "tessera_table_evictions_total", {"table=\"user\""}), 0);
  EXPECT_EQ(Sample(text, "tessera_table_admission_refused_total", {"table=\"rare\""}), 5);
  EXPECT_EQ(Sample(text, "tessera_table_admission_refused_total", {"table=\"user\""}), 0);
  // The collection's memory budget (the default: some of this machine's memory) and the
  // 300 rows' share of it.
  EXPECT_GT(Sample(text, "tessera_memory_budget_bytes", {}), 0);
  EXPECT_GE(Sample(text, "tessera_memory_budget_used_bytes", {}), 300 * 8 * 4);
  (*server)->Shutdown();
}

TEST(Metrics, ABusyPortIsRefusedWithTheAddress) {
  auto first = observability::Metrics::Start("127.0.0.1", 0, "shard");
  ASSERT_TRUE(first.ok());
  auto second = observability::Metrics::Start("127.0.0.1", (*first)->port(), "shard");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(
      absl::StrContains(second.status().message(), absl::StrCat("127.0.0.1:", (*first)->port())));
}

}  // namespace
}  // namespace tessera::server
