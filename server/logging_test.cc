// Structured RPC logs of a shard server: a failed call names its method, code, table,
// shard and request id, as text or JSON.

#include "observability/logging.h"

#include "absl/strings/str_cat.h"
#include "embedding/collection.h"
#include "embedding/inprocess_collection.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/serving.h"
#include "server/shard_service.h"
#include "tessera/v1/embedding_service.grpc.pb.h"

namespace tessera::server {
namespace {

using observability::ConfigureLogging;

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

class LoggingTest : public ::testing::Test {
 protected:
  void Start() {
    tables_ = std::move(embedding::NewInProcessCollection(1)).value();
    ShardOptions o;
    o.shard_index = 3;
    o.num_shards = 4;
    service_ = std::make_unique<ShardService>(tables_.get(), o);
    ListenOptions listen;
    listen.shard_index = 3;
    int port = 0;
    server_ = std::move(StartServer(service_.get(), listen, &port)).value();
    stub_ = v1::EmbeddingShard::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }
  // A lookup of table 'nope' with request id `id`; returns what the server logged.
  std::string FailedLookup(const std::string& id, std::string* returned_id = nullptr) {
    testing::internal::CaptureStderr();
    v1::LookupRequest req;
    req.set_table("nope");
    req.add_ids(1);
    v1::LookupResponse resp;
    grpc::ClientContext ctx;
    if (!id.empty()) ctx.AddMetadata("x-request-id", id);
    EXPECT_EQ(stub_->Lookup(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
    spdlog::default_logger()->flush();
    if (returned_id != nullptr) {
      auto it = ctx.GetServerTrailingMetadata().find("x-request-id");
      if (it != ctx.GetServerTrailingMetadata().end()) {
        *returned_id = std::string(it->second.data(), it->second.size());
      }
    }
    return testing::internal::GetCapturedStderr();
  }

  std::unique_ptr<embedding::ShardTables> tables_;
  std::unique_ptr<ShardService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::EmbeddingShard::Stub> stub_;
};

TEST_F(LoggingTest, AFailedCallIsOneWarningNamingTableShardAndRequest) {
  ASSERT_TRUE(ConfigureLogging({"tessera-shard", "info", "text"}).ok());
  Start();
  std::string returned;
  const std::string log = FailedLookup("req-42", &returned);
  EXPECT_THAT(log, AllOf(HasSubstr("level=warning"), HasSubstr("process=tessera-shard"),
                         HasSubstr("msg=\"rpc failed\""),
                         HasSubstr("method=/tessera.v1.EmbeddingShard/Lookup"),
                         HasSubstr("code=NOT_FOUND"), HasSubstr("table=nope"), HasSubstr("shard=3"),
                         HasSubstr("request=req-42"), HasSubstr("error=\"table 'nope' not found")));
  EXPECT_EQ(returned, "req-42");
  // Without an id the server makes one and returns it.
  FailedLookup("", &returned);
  EXPECT_FALSE(returned.empty());
  // Successful calls are logged at debug level only.
  testing::internal::CaptureStderr();
  v1::ListTablesResponse tables;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->ListTables(&ctx, {}, &tables).ok());
  EXPECT_THAT(testing::internal::GetCapturedStderr(), Not(HasSubstr("ListTables")));
}

TEST_F(LoggingTest, JsonLinesCarryTheSameFields) {
  ASSERT_TRUE(ConfigureLogging({"tessera-shard", "debug", "json"}).ok());
  Start();
  const std::string log = FailedLookup("j\"1");
  EXPECT_THAT(log, AllOf(HasSubstr(R"({"ts":")"), HasSubstr(R"("level":"warning")"),
                         HasSubstr(R"("table":"nope")"), HasSubstr(R"("shard":"3")"),
                         HasSubstr(R"("request":"j\"1")"), HasSubstr(R"("code":"NOT_FOUND")")));
  ASSERT_TRUE(ConfigureLogging({"tessera-shard", "info", "text"}).ok());
}

TEST(Logging, UnknownLevelsAndFormatsAreRefused) {
  EXPECT_EQ(ConfigureLogging({"p", "loud", "text"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConfigureLogging({"p", "info", "xml"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ConfigureLogging({"p", "off", "text"}).ok());
}

}  // namespace
}  // namespace tessera::server
