// Starts real tessera-shard processes on 127.0.0.1, talks to them over gRPC, and always
// kills what it started.

#include "tests/shard_process.h"

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "embedding/collection.h"
#include "embedding/inprocess_collection.h"
#include "embedding/sharding.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tessera/v1/embedding_service.grpc.pb.h"
#include "tests/support/table_configs.h"

namespace {

using tessera::testing::ShardProcess;

tessera::v1::TableConfig Config() {
  return tessera::testing::TestTable("user", 8, 4242, tessera::v1::ADAGRAD, 0.1f);
}

TEST(ShardProcesses, TwoShardsServeTheirPartsAndADeadShardIsUnavailable) {
  constexpr int kShards = 2;
  std::vector<std::unique_ptr<ShardProcess>> procs;
  std::vector<std::unique_ptr<tessera::v1::EmbeddingShard::Stub>> stubs;
  for (int k = 0; k < kShards; ++k) {
    procs.push_back(std::make_unique<ShardProcess>(k, kShards));
    ASSERT_FALSE(procs[k]->address().empty()) << "shard " << k << " did not start";
    auto channel = grpc::CreateChannel(procs[k]->address(), grpc::InsecureChannelCredentials());
    // Wait on the health check, not on a sleep.
    auto health = grpc::health::v1::Health::NewStub(channel);
    grpc::ClientContext hctx;
    hctx.set_wait_for_ready(true);
    hctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::health::v1::HealthCheckResponse hresp;
    ASSERT_TRUE(health->Check(&hctx, {}, &hresp).ok());
    ASSERT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
    stubs.push_back(tessera::v1::EmbeddingShard::NewStub(channel));
    grpc::ClientContext ctx;
    tessera::v1::CreateTableRequest req;
    *req.mutable_config() = Config();
    tessera::v1::CreateTableResponse resp;
    ASSERT_TRUE(stubs[k]->CreateTable(&ctx, req, &resp).ok());
  }

  auto reference = std::move(tessera::embedding::NewInProcessCollection(kShards)).value();
  ASSERT_TRUE(reference->CreateTable(Config()).ok());
  std::vector<int64_t> ids;
  std::vector<float> grads;
  for (int i = 0; i < 64; ++i) {
    ids.push_back(i * 1000003);
    for (int j = 0; j < 8; ++j) grads.push_back(0.01f * ((i + j) % 9 - 4));
  }
  ASSERT_TRUE(reference->PushGradients("user", ids, grads, 1).ok());

  // Route by the shard map's function, push, then read back row by row.
  for (int k = 0; k < kShards; ++k) {
    tessera::v1::PushGradientsRequest push;
    push.set_table("user");
    push.set_step(1);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (tessera::embedding::ShardOf(ids[i], 4242, kShards) != k) continue;
      push.add_ids(ids[i]);
      for (int j = 0; j < 8; ++j) push.add_gradients(grads[i * 8 + j]);
    }
    grpc::ClientContext ctx;
    tessera::v1::PushGradientsResponse resp;
    ASSERT_TRUE(stubs[k]->PushGradients(&ctx, push, &resp).ok());
    EXPECT_EQ(resp.rows_updated(), push.ids_size());
  }
  std::vector<float> want(ids.size() * 8);
  ASSERT_TRUE(reference->Lookup("user", ids, absl::MakeSpan(want)).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int k = tessera::embedding::ShardOf(ids[i], 4242, kShards);
    tessera::v1::LookupRequest req;
    req.set_table("user");
    req.add_ids(ids[i]);
    grpc::ClientContext ctx;
    tessera::v1::LookupResponse resp;
    ASSERT_TRUE(stubs[k]->Lookup(&ctx, req, &resp).ok());
    ASSERT_EQ(std::vector<float>(resp.values().begin(), resp.values().end()),
              std::vector<float>(want.begin() + i * 8, want.begin() + i * 8 + 8))
        << "id " << ids[i];
  }

  // Kill shard 1: calls to it fail with UNAVAILABLE, shard 0 keeps serving.
  procs[1]->Kill();
  int64_t id0 = 0, id1 = 0;
  while (tessera::embedding::ShardOf(id0, 4242, kShards) != 0) ++id0;
  while (tessera::embedding::ShardOf(id1, 4242, kShards) != 1) ++id1;
  tessera::v1::LookupRequest req;
  req.set_table("user");
  req.add_ids(id1);
  grpc::ClientContext dead;
  dead.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  tessera::v1::LookupResponse resp;
  EXPECT_EQ(stubs[1]->Lookup(&dead, req, &resp).error_code(), grpc::StatusCode::UNAVAILABLE);
  req.set_ids(0, id0);
  grpc::ClientContext alive;
  EXPECT_TRUE(stubs[0]->Lookup(&alive, req, &resp).ok());
}

TEST(ShardProcesses, ASecondServerOnATakenPortRefusesToStart) {
  ShardProcess first(0, 1);
  ASSERT_FALSE(first.address().empty());
  const std::string port = first.address().substr(first.address().rfind(':') + 1);
  for (const char* binary : {TESSERA_SHARD_BIN, TESSERA_COORDINATOR_BIN}) {
    std::vector<std::string> args = {absl::StrCat("--port=", port)};
    if (std::string(binary) == TESSERA_COORDINATOR_BIN)
      args.push_back(absl::StrCat("--shards=", first.address()));
    tessera::base::ServerProcess second(binary, args);
    EXPECT_TRUE(second.address().empty()) << binary << " started on a taken port";
    EXPECT_EQ(second.WaitForExit(), 1) << binary;
  }
  // What it prints is the line that says what to do, not gRPC's error tree before it.
  std::string out;
  FILE* p = popen(absl::StrCat(TESSERA_SHARD_BIN, " --port=", port, " 2>&1").c_str(), "r");
  char buf[1024];
  for (size_t n; p != nullptr && (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  if (p != nullptr) pclose(p);
  EXPECT_THAT(out, ::testing::HasSubstr("cannot listen on 127.0.0.1:" + port));
  EXPECT_THAT(out, ::testing::Not(::testing::HasSubstr("Address already in use {")));
  EXPECT_LT(out.size(), 300u) << out;
}

// Health checks by service name (as clients in other languages send them) are answered for
// the service each server serves; another name is NOT_FOUND.
TEST(ShardProcesses, HealthChecksAreAnsweredForEachServersServiceName) {
  ShardProcess shard(0, 1);
  ASSERT_FALSE(shard.address().empty());
  tessera::base::ServerProcess coordinator(TESSERA_COORDINATOR_BIN,
                                           {absl::StrCat("--shards=", shard.address())});
  ASSERT_FALSE(coordinator.address().empty());
  auto status = [](const std::string& address, const std::string& service) {
    auto health = grpc::health::v1::Health::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    const grpc::Status s = health->Check(&ctx, req, &resp);
    return s.ok() ? grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status())
                  : absl::StrCat("error ", s.error_code());
  };
  EXPECT_EQ(status(shard.address(), "tessera.v1.EmbeddingShard"), "SERVING");
  EXPECT_EQ(status(shard.address(), ""), "SERVING");
  EXPECT_EQ(status(shard.address(), "tessera.v1.Coordinator"),
            absl::StrCat("error ", grpc::StatusCode::NOT_FOUND));
  EXPECT_EQ(status(coordinator.address(), "tessera.v1.Coordinator"), "SERVING");
  EXPECT_EQ(status(coordinator.address(), ""), "SERVING");
}

// A coordinator whose --shards contradict the places its shards serve (another count, or
// another order; a data directory recorded for another map) refuses to start, naming the
// shard's place and the flags, instead of routing requests every shard refuses.
TEST(ShardProcesses, ACoordinatorRefusesShardsThatServeOtherPlaces) {
  std::vector<std::unique_ptr<ShardProcess>> shards;
  for (int k = 0; k < 3; ++k) {
    shards.push_back(std::make_unique<ShardProcess>(k, 3));
    ASSERT_FALSE(shards[k]->address().empty());
  }
  const std::string a = shards[0]->address(), b = shards[1]->address(),
                    c = shards[2]->address();
  for (const std::string& list : {a + "," + b, b + "," + a + "," + c}) {
    tessera::base::ServerProcess coordinator(TESSERA_COORDINATOR_BIN, {"--shards=" + list},
                                             /*quiet=*/true);
    EXPECT_TRUE(coordinator.address().empty()) << list;
    EXPECT_EQ(coordinator.WaitForExit(), 1) << list;
  }
  // What it says (bounded: were it to start, `timeout` stops it).
  const std::string cmd = absl::StrCat("timeout 30 ", TESSERA_COORDINATOR_BIN, " --shards=", a,
                                       ",", b, " 2>&1");
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[1024];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  pclose(p);
  EXPECT_THAT(out,
              ::testing::HasSubstr("serves place 0 of 3 at shard map version 1, but --shards="))
      << out;
  tessera::base::ServerProcess coordinator(TESSERA_COORDINATOR_BIN,
                                           {"--shards=" + a + "," + b + "," + c});
  EXPECT_FALSE(coordinator.address().empty()) << "the shards' own map";
}

// A port outside [0, 65535] is refused, not taken modulo 65536 (70000 would listen on 4464).
TEST(ShardProcesses, APortOutsideItsRangeIsRefused) {
  ShardProcess shard(0, 1);
  ASSERT_FALSE(shard.address().empty());
  for (const char* binary : {TESSERA_SHARD_BIN, TESSERA_COORDINATOR_BIN}) {
    for (const char* port : {"--port=70000", "--port=-1"}) {
      std::vector<std::string> args = {port};
      if (std::string(binary) == TESSERA_COORDINATOR_BIN) {
        args.push_back(absl::StrCat("--shards=", shard.address()));
      }
      tessera::base::ServerProcess server(binary, args, /*quiet=*/true);
      EXPECT_TRUE(server.address().empty()) << binary << " " << port << " started";
      EXPECT_EQ(server.WaitForExit(), 1) << binary << " " << port;
    }
  }
}

TEST(ShardProcesses, ACliPointedAtAShardSaysSo) {
  ShardProcess shard(0, 1);
  ASSERT_FALSE(shard.address().empty());
  const std::string cmd =
      absl::StrCat(TESSERA_CLI_BIN, " --coordinator=", shard.address(), " tables 2>&1");
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[1024];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_THAT(out, ::testing::HasSubstr("is it a tessera-shard?")) << out;
}

// Issue 25, item 10: a batch over a server's id limit is refused naming the flag that
// sets it, on the coordinator and on a shard alike.
TEST(ShardProcesses, ABatchOverTheIdLimitNamesTheFlagThatSetsIt) {
  tessera::base::ServerProcess shard(TESSERA_SHARD_BIN,
                                     {"--shard_index=0", "--num_shards=1", "--max_batch_ids=4"});
  ASSERT_FALSE(shard.address().empty());
  tessera::base::ServerProcess coordinator(
      TESSERA_COORDINATOR_BIN, {absl::StrCat("--shards=", shard.address()), "--max_batch_ids=3"});
  ASSERT_FALSE(coordinator.address().empty());
  ASSERT_TRUE(tessera::client::WaitHealthy(coordinator.address()));
  auto cli = [&](const std::string& address, const std::string& args) {
    std::string out;
    FILE* p = popen(absl::StrCat(TESSERA_CLI_BIN, " --coordinator=", address, " ", args, " 2>&1")
                        .c_str(),
                    "r");
    char buf[1024];
    for (size_t n; p != nullptr && (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
    if (p != nullptr) pclose(p);
    return out;
  };
  ASSERT_THAT(cli(coordinator.address(), "create --table=t --dim=2"),
              ::testing::HasSubstr("created"));
  EXPECT_THAT(cli(coordinator.address(), "lookup --table=t --ids=1,2,3"),
              ::testing::HasSubstr("1:"));
  EXPECT_THAT(cli(coordinator.address(), "lookup --table=t --ids=1,2,3,4"),
              ::testing::HasSubstr("4 rows (ids, or bags) is over the limit of 3 "
                                   "(tessera-coordinator --max_batch_ids)"));
}

// A shard past its --memory_limit refuses new rows with the reason, over the wire; the
// rows it holds stay served.
TEST(ShardProcesses, AShardPastItsMemoryLimitRefusesNewRowsWithTheReason) {
  // Enough for a few hundred rows of dim 8 with Adagrad (each about 128 bytes stored).
  tessera::base::ServerProcess shard(TESSERA_SHARD_BIN,
                                     {"--shard_index=0", "--num_shards=1", "--memory_limit=40000"});
  ASSERT_FALSE(shard.address().empty());
  ASSERT_TRUE(tessera::client::WaitHealthy(shard.address()));
  auto stub = tessera::v1::EmbeddingShard::NewStub(
      grpc::CreateChannel(shard.address(), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext ctx;
    tessera::v1::CreateTableRequest req;
    *req.mutable_config() = Config();
    tessera::v1::CreateTableResponse resp;
    ASSERT_TRUE(stub->CreateTable(&ctx, req, &resp).ok());
  }
  auto lookup = [&](int64_t first, int n, tessera::v1::LookupResponse* resp) {
    grpc::ClientContext ctx;
    tessera::v1::LookupRequest req;
    req.set_table("user");
    for (int64_t id = first; id < first + n; ++id) req.add_ids(id);
    return stub->Lookup(&ctx, req, resp);
  };
  tessera::v1::LookupResponse kept;
  ASSERT_TRUE(lookup(0, 100, &kept).ok());
  tessera::v1::LookupResponse refused;
  const grpc::Status s = lookup(1000, 1000, &refused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("table 'user': the memory budget for rows"));
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("--memory_limit"));
  tessera::v1::LookupResponse again;
  ASSERT_TRUE(lookup(0, 100, &again).ok());
  EXPECT_THAT(again.values(), ::testing::ElementsAreArray(kept.values()));
  // Its stats show the budget and what the rows take of it, and so does tessera-cli.
  grpc::ClientContext ctx;
  tessera::v1::StatsResponse stats;
  ASSERT_TRUE(stub->Stats(&ctx, tessera::v1::StatsRequest(), &stats).ok());
  ASSERT_EQ(stats.tables_size(), 1);
  EXPECT_EQ(stats.tables(0).memory_budget_bytes(), 40000);
  EXPECT_GT(stats.tables(0).memory_budget_used_bytes(), 100 * 128);
  EXPECT_LE(stats.tables(0).memory_budget_used_bytes(), 40000);
  tessera::base::ServerProcess coordinator(TESSERA_COORDINATOR_BIN,
                                           {absl::StrCat("--shards=", shard.address())});
  ASSERT_TRUE(tessera::client::WaitHealthy(coordinator.address()));
  std::string out;
  FILE* p =
      popen(absl::StrCat(TESSERA_CLI_BIN, " --coordinator=", coordinator.address(), " stats 2>&1")
                .c_str(),
            "r");
  char buf[1024];
  for (size_t n; p != nullptr && (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  if (p != nullptr) pclose(p);
  EXPECT_THAT(out, ::testing::HasSubstr("shard 0 memory budget: "));
}

TEST(ShardProcesses, ServeReflectionListingTheirServices) {
  ShardProcess shard(0, 1);
  ASSERT_FALSE(shard.address().empty());
  ASSERT_TRUE(tessera::client::WaitHealthy(shard.address()));
  auto stub = grpc::reflection::v1alpha::ServerReflection::NewStub(
      grpc::CreateChannel(shard.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto stream = stub->ServerReflectionInfo(&ctx);
  grpc::reflection::v1alpha::ServerReflectionRequest req;
  req.set_list_services("");
  ASSERT_TRUE(stream->Write(req));
  stream->WritesDone();
  grpc::reflection::v1alpha::ServerReflectionResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  std::vector<std::string> names;
  for (const auto& s : resp.list_services_response().service()) names.push_back(s.name());
  EXPECT_THAT(names, ::testing::Contains("tessera.v1.EmbeddingShard"));
  EXPECT_THAT(names, ::testing::Contains("grpc.health.v1.Health"));
  while (stream->Read(&resp)) {
  }
  EXPECT_TRUE(stream->Finish().ok());
}

// Issue 41, item 12: grpc.reflection.v1 too, as clients on newer gRPC releases ask it: the
// services, and the file defining a service with the files it imports, on a shard and on
// the coordinator; an unknown symbol is NOT_FOUND in the answer.
TEST(ShardProcesses, ServeReflectionV1WithTheirServicesAndFiles) {
  ShardProcess shard(0, 1);
  ASSERT_TRUE(tessera::client::WaitHealthy(shard.address()));
  tessera::base::ServerProcess coordinator(TESSERA_COORDINATOR_BIN,
                                           {absl::StrCat("--shards=", shard.address())});
  ASSERT_TRUE(tessera::client::WaitHealthy(coordinator.address()));
  namespace v1 = grpc::reflection::v1;
  for (const auto& [address, service] :
       {std::pair{shard.address(), std::string("tessera.v1.EmbeddingShard")},
        std::pair{coordinator.address(), std::string("tessera.v1.Coordinator")}}) {
    SCOPED_TRACE(service);
    auto stub = v1::ServerReflection::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = stub->ServerReflectionInfo(&ctx);
    v1::ServerReflectionRequest list, file, unknown;
    list.set_list_services("");
    file.set_file_containing_symbol(service);
    unknown.set_file_containing_symbol("tessera.v1.NoSuchService");
    v1::ServerReflectionResponse resp;
    ASSERT_TRUE(stream->Write(list));
    ASSERT_TRUE(stream->Read(&resp));
    std::vector<std::string> names;
    for (const auto& s : resp.list_services_response().service()) names.push_back(s.name());
    EXPECT_THAT(names,
                ::testing::IsSupersetOf({service, std::string("grpc.health.v1.Health"),
                                         std::string("grpc.reflection.v1.ServerReflection")}));
    ASSERT_TRUE(stream->Write(file));
    ASSERT_TRUE(stream->Read(&resp));
    std::vector<std::string> files;
    bool defines = false;
    for (const std::string& bytes : resp.file_descriptor_response().file_descriptor_proto()) {
      google::protobuf::FileDescriptorProto proto;
      ASSERT_TRUE(proto.ParseFromString(bytes));
      files.push_back(proto.name());
      for (const auto& s : proto.service()) {
        defines = defines || absl::StrCat(proto.package(), ".", s.name()) == service;
      }
    }
    EXPECT_TRUE(defines) << "no file sent defines " << service;
    EXPECT_THAT(files, ::testing::Contains("tessera/v1/config.proto"));  // an import
    ASSERT_TRUE(stream->Write(unknown));
    ASSERT_TRUE(stream->Read(&resp));
    EXPECT_EQ(resp.error_response().error_code(), grpc::StatusCode::NOT_FOUND);
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }
}

}  // namespace
