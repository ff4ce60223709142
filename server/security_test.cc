// Tokens, TLS and mutual TLS on in-process servers on 127.0.0.1, with certificates this
// test makes with the openssl command.

#include "wire/security.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "client/embedding_client.h"
#include "embedding/collection.h"
#include "embedding/inprocess_collection.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/auth.h"
#include "server/coordinator_service.h"
#include "server/serving.h"
#include "server/shard_service.h"
#include "tessera/v1/embedding_service.grpc.pb.h"
#include "tests/support/table_configs.h"
#include "tests/support/temp_dir.h"

namespace tessera::server {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A CA, a server certificate for 127.0.0.1 / localhost and a client certificate signed by
// it, and a second CA that signed nothing here.
class Certificates {
 public:
  Certificates() {
    dir_ = testing::MakeTempDir("tessera-tls");
    const std::string d = dir_;
    std::ofstream(d + "/server.ext") << "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
    std::ofstream(d + "/client.ext") << "extendedKeyUsage=clientAuth\n";
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string script = absl::StrCat(
        "set -e; cd ", d, "; ", "openssl req -x509 ", key,
        " -keyout ca.key -out ca.pem -days 2 -subj /CN=tessera-test-ca; ", "openssl req -x509 ",
        key, " -keyout other-ca.key -out other-ca.pem -days 2 -subj /CN=other; ", "openssl req ",
        key, " -keyout server.key -out server.csr -subj /CN=localhost; ",
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 ",
        "-extfile server.ext -out server.pem; ", "openssl req ", key,
        " -keyout client.key -out client.csr -subj /CN=trainer; ",
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 ",
        "-extfile client.ext -out client.pem");
    ok_ =
        std::system(absl::StrCat("bash -c '", script, "' > ", d, "/openssl.log 2>&1").c_str()) == 0;
  }
  ~Certificates() { fs::remove_all(dir_); }
  bool ok() const { return ok_; }
  std::string Read(const std::string& name) const {
    std::ifstream in(dir_ + "/" + name);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

 private:
  std::string dir_;
  bool ok_ = false;
};

std::unique_ptr<grpc::Server> Serve(grpc::Service* service, const ServerSecurity& security,
                                    std::string* address) {
  ListenOptions listen;
  listen.credentials = MakeServerCredentials(security);
  int port = 0;
  auto server = StartServer(service, listen, &port);
  EXPECT_TRUE(server.ok()) << server.status();
  *address = absl::StrCat("127.0.0.1:", port);
  return std::move(server).value();
}

v1::TableConfig Config(const std::string& name) {
  return testing::TestTable(name, 4, 5, v1::SGD, 1.0f);
}

class TokenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tables_ = std::move(embedding::NewInProcessCollection(1)).value();
    ServerSecurity security;
    security.token = "full-secret";
    security.read_only_token = "reader-secret";
    ShardOptions o;
    o.auth = CallAuthorizer(security);
    o.max_tables = 2;
    service_ = std::make_unique<ShardService>(tables_.get(), o);
    server_ = Serve(service_.get(), security, &address_);
    channel_ = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
    stub_ = v1::EmbeddingShard::NewStub(channel_);
  }
  void TearDown() override { server_->Shutdown(); }

  std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    return ctx;
  }
  grpc::Status Create(const std::string& token, const std::string& table) {
    v1::CreateTableRequest req;
    *req.mutable_config() = Config(table);
    v1::CreateTableResponse resp;
    return stub_->CreateTable(Ctx(token).get(), req, &resp);
  }
  grpc::Status Push(const std::string& token) {
    v1::PushGradientsRequest req;
    req.set_table("user");
    req.add_ids(1);
    for (int j = 0; j < 4; ++j) req.add_gradients(1.0f);
    v1::PushGradientsResponse resp;
    return stub_->PushGradients(Ctx(token).get(), req, &resp);
  }
  std::vector<float> Row(const std::string& token, grpc::Status* status = nullptr) {
    v1::LookupRequest req;
    req.set_table("user");
    req.add_ids(1);
    v1::LookupResponse resp;
    grpc::Status s = stub_->Lookup(Ctx(token).get(), req, &resp);
    if (status != nullptr) *status = s;
    return std::vector<float>(resp.values().begin(), resp.values().end());
  }
  int Tables() {
    v1::ListTablesResponse resp;
    EXPECT_TRUE(stub_->ListTables(Ctx("full-secret").get(), {}, &resp).ok());
    return resp.tables_size();
  }

  std::unique_ptr<embedding::ShardTables> tables_;
  std::unique_ptr<ShardService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::EmbeddingShard::Stub> stub_;
};

TEST_F(TokenTest, CallsWithoutOrWithAWrongTokenAreRefusedAndChangeNothing) {
  grpc::Status s = Create("", "user");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), HasSubstr("needs a token"));
  EXPECT_EQ(Create("full-secre", "user").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Create("full-secret-and-more", "user").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Tables(), 0);

  ASSERT_TRUE(Create("full-secret", "user").ok());
  const std::vector<float> before = Row("full-secret");
  ASSERT_EQ(before.size(), 4u);
  EXPECT_EQ(Push("").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Push("wrong").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  grpc::Status read;
  Row("", &read);
  EXPECT_EQ(read.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Row("full-secret"), before);  // no push got through

  // A header that is not "Bearer <token>" is refused too.
  auto ctx = Ctx("");
  ctx->AddMetadata("authorization", "full-secret");
  v1::ListTablesResponse resp;
  EXPECT_EQ(stub_->ListTables(ctx.get(), {}, &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  ASSERT_TRUE(Push("full-secret").ok());
  const std::vector<float> after = Row("full-secret");
  for (int j = 0; j < 4; ++j) EXPECT_FLOAT_EQ(after[j], before[j] - 1.0f);
}

TEST_F(TokenTest, TheReadOnlyTokenLooksUpButCannotWrite) {
  ASSERT_TRUE(Create("full-secret", "user").ok());
  const std::vector<float> before = Row("full-secret");
  grpc::Status read;
  EXPECT_EQ(Row("reader-secret", &read), before);
  EXPECT_TRUE(read.ok()) << read.error_message();
  grpc::Status push = Push("reader-secret");
  EXPECT_EQ(push.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(push.error_message(), HasSubstr("read-only"));
  EXPECT_EQ(Create("reader-secret", "other").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  v1::CheckpointRequest ck;
  v1::CheckpointResponse ck_resp;
  EXPECT_EQ(stub_->Checkpoint(Ctx("reader-secret").get(), ck, &ck_resp).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Row("full-secret"), before);
  EXPECT_EQ(Tables(), 1);
  v1::StatsResponse stats;
  EXPECT_TRUE(stub_->Stats(Ctx("reader-secret").get(), {}, &stats).ok());
}

TEST_F(TokenTest, HealthChecksNeedNoTokenAndTheTableLimitHolds) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(health->Check(&ctx, {}, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  ASSERT_TRUE(Create("full-secret", "a").ok());
  ASSERT_TRUE(Create("full-secret", "b").ok());
  grpc::Status third = Create("full-secret", "c");
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(third.error_message(), HasSubstr("--max_tables"));
  EXPECT_EQ(Tables(), 2);
}

// A shard requiring client certificates and a token, a coordinator serving TLS that calls
// it with its own certificate, and clients with the right or the wrong credentials.
class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(certs_.ok()) << certs_.Read("openssl.log");
    ServerSecurity shard_security;
    shard_security.cert_chain = certs_.Read("server.pem");
    shard_security.private_key = certs_.Read("server.key");
    shard_security.client_ca = certs_.Read("ca.pem");
    shard_security.token = "cluster-token";
    tables_ = std::move(embedding::NewInProcessCollection(1)).value();
    ShardOptions so;
    so.auth = CallAuthorizer(shard_security);
    shard_ = std::make_unique<ShardService>(tables_.get(), so);
    std::string shard_address;
    servers_.push_back(Serve(shard_.get(), shard_security, &shard_address));
    shard_address_ = shard_address;

    client::RouterOptions ro;
    ro.security = Trusted();
    router_ = std::make_unique<client::ShardRouter>(std::vector<std::string>{shard_address}, ro);
    ServerSecurity coordinator_security = shard_security;
    coordinator_security.client_ca.clear();  // TLS, no client certificate asked for
    CoordinatorOptions co;
    co.auth = CallAuthorizer(coordinator_security);
    coordinator_ = std::make_unique<CoordinatorService>(router_.get(), 1, co);
    servers_.push_back(Serve(coordinator_.get(), coordinator_security, &coordinator_address_));
  }
  void TearDown() override {
    for (auto& s : servers_) s->Shutdown();
  }

  // Trusts the test CA, presents the client certificate, carries the token.
  wire::ClientSecurity Trusted() const {
    wire::ClientSecurity s;
    s.root_certs = certs_.Read("ca.pem");
    s.cert_chain = certs_.Read("client.pem");
    s.private_key = certs_.Read("client.key");
    s.token = "cluster-token";
    return s;
  }
  absl::StatusOr<std::unique_ptr<client::EmbeddingClient>> Connect(
      const wire::ClientSecurity& security,
      client::ClientOptions::Mode mode = client::ClientOptions::Mode::kSmart) {
    client::ClientOptions o;
    o.mode = mode;
    o.security = security;
    o.deadline = std::chrono::milliseconds(2000);
    o.retry.max_retries = 1;
    return client::EmbeddingClient::Connect(coordinator_address_, o);
  }

  Certificates certs_;
  std::unique_ptr<embedding::ShardTables> tables_;
  std::unique_ptr<ShardService> shard_;
  std::unique_ptr<client::ShardRouter> router_;
  std::unique_ptr<CoordinatorService> coordinator_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
  std::string shard_address_, coordinator_address_;
};

TEST_F(TlsTest, ClientsWithTheClustersCaCertificateAndTokenTrainThroughBothPaths) {
  for (const auto mode :
       {client::ClientOptions::Mode::kSmart, client::ClientOptions::Mode::kCoordinator}) {
    auto c = Connect(Trusted(), mode);
    ASSERT_TRUE(c.ok()) << c.status();
    const std::string table = mode == client::ClientOptions::Mode::kSmart ? "smart" : "via";
    ASSERT_TRUE((*c)->CreateTable(Config(table)).ok());
    const std::vector<int64_t> ids = {3, 4};
    std::vector<float> before(8), after(8);
    ASSERT_TRUE((*c)->Lookup(table, ids, absl::MakeSpan(before), {}).ok());
    ASSERT_TRUE((*c)->PushGradients(table, ids, std::vector<float>(8, 0.5f), 1).ok());
    ASSERT_TRUE((*c)->Lookup(table, ids, absl::MakeSpan(after), {}).ok());
    for (int j = 0; j < 8; ++j) EXPECT_FLOAT_EQ(after[j], before[j] - 0.5f);
  }
}

TEST_F(TlsTest, AWrongCaAPlaintextClientOrAMissingTokenIsRefused) {
  wire::ClientSecurity wrong_ca = Trusted();
  wrong_ca.root_certs = certs_.Read("other-ca.pem");
  auto c = Connect(wrong_ca);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);

  auto plain = Connect(wire::ClientSecurity());
  ASSERT_FALSE(plain.ok());
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kUnavailable);

  wire::ClientSecurity no_token = Trusted();
  no_token.token.clear();
  auto anonymous = Connect(no_token);
  ASSERT_FALSE(anonymous.ok());
  EXPECT_EQ(anonymous.status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(TlsTest, TheShardRefusesAClientWithoutACertificate) {
  auto c = Connect(Trusted());
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->CreateTable(Config("t")).ok());
  // Straight to the shard, trusting its certificate and with the token, but with no
  // client certificate: the handshake fails.
  wire::ClientSecurity no_cert = Trusted();
  no_cert.cert_chain.clear();
  no_cert.private_key.clear();
  client::RouterOptions ro;
  ro.security = no_cert;
  ro.deadline = std::chrono::milliseconds(2000);
  client::ShardRouter direct({shard_address_}, ro);
  std::vector<float> out(4);
  const std::vector<int64_t> id = {1};
  const v1::TableConfig config = Config("t");
  embedding::TableBags part{"t", id, {}, {}, v1::SUM, absl::MakeSpan(out)};
  absl::Status s = direct.LookupBatch({&config, 1}, {&part, 1}, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  ro.security = Trusted();
  client::ShardRouter with_cert({shard_address_}, ro);
  EXPECT_TRUE(with_cert.LookupBatch({&config, 1}, {&part, 1}, false).ok());
}

TEST(ClientSecurity, FilesAreLoadedAndBadOnesNamed) {
  Certificates certs;
  ASSERT_TRUE(certs.ok());
  std::ofstream(certs.Path("token")) << "  s3cret \nignored second line\n";
  wire::ClientSecurityFiles files;
  files.ca_file = certs.Path("ca.pem");
  files.token_file = certs.Path("token");
  absl::StatusOr<wire::ClientSecurity> s = wire::LoadClientSecurity(files);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->token, "s3cret");
  EXPECT_TRUE(s->tls());
  files.cert_file = certs.Path("client.pem");  // without its key
  EXPECT_EQ(wire::LoadClientSecurity(files).status().code(), absl::StatusCode::kInvalidArgument);
  files.key_file = certs.Path("missing.key");
  absl::Status missing = wire::LoadClientSecurity(files).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing.message()), HasSubstr("missing.key"));
}

}  // namespace
}  // namespace tessera::server
