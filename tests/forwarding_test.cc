// The coordinator's data path as it forwards: a lookup answered with the shards' answers
// as they came (BatchLookupRequest.shard_rows), merged by the client, and a push carried by
// the next lookup (BatchLookupRequest.push). Answers must equal the smart client's and the
// in-process tables' bit for bit, a carried push must be applied once however many of its
// answers are lost, and a request built on a stale shard map must be refused before any
// of it is applied.

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "client/channel_policy.h"
#include "client/embedding_client.h"
#include "embedding/collection.h"
#include "embedding/inprocess_collection.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/shard_service.h"
#include "tests/support/answer_loser.h"
#include "tests/support/local_server.h"
#include "tests/support/memory_shards.h"
#include "tests/support/reference_cluster.h"
#include "tests/support/table_configs.h"
#include "tests/support/test_client.h"
#include "wire/packed_bytes.h"

namespace tessera {
namespace {

using testing::StartLocalServer;

// Bit for bit (EXPECT_EQ on floats takes -0 for 0).
void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << what;
}

class ForwardingTest : public testing::ReferenceClusterTest {
 protected:
  static constexpr int kShards = 3;  // three: the order of a sum of partial sums shows

  void SetUp() override {
    const std::vector<std::string> addresses = shards_.Start(kShards, kLosable);
    losing_coordinator_ = std::make_unique<testing::AnswerLoser>(kLosable);
    ASSERT_NO_FATAL_FAILURE(StartCoordinator(
        addresses, RetryingRouter(std::chrono::milliseconds(2000)), losing_coordinator_.get()));
    reference_ = std::move(embedding::NewInProcessCollection(kShards)).value();
    coordinator_stub_ = v1::Coordinator::NewStub(grpc::CreateCustomChannel(
        coordinator_address_, grpc::InsecureChannelCredentials(), client::ChannelArgs()));
  }
  void TearDown() override {
    ReferenceClusterTest::TearDown();
    shards_.Shutdown();
  }

  // Tables of three dims and optimizers, on the cluster and the reference.
  void CreateTables(client::EmbeddingClient& c) {
    CreateBoth(c, testing::TestTable("a", 4, 11, v1::ADAGRAD, 0.5f));
    CreateBoth(c, testing::TestTable("b", 8, 12, v1::SGD, 1.0f));
    CreateBoth(c, testing::TestTable("c", 16, 13, v1::ADAGRAD, 0.1f));
  }

  const std::vector<std::string> kLosable = {"/BatchLookup"};
  testing::MemoryShards shards_;
  std::unique_ptr<testing::AnswerLoser> losing_coordinator_;
  std::unique_ptr<v1::Coordinator::Stub> coordinator_stub_;
};

// A batch of every shape a lookup takes, with its output buffers: ids alone (repeated),
// single-id bags, weighted bags, bags of many ids (pooled on the shards: more ids than
// bags), MEAN and SQRTN, empty bags.
struct Shapes {
  std::vector<int64_t> ids_a = {5, 9, 5, 1000003, 77, 9, 12};
  std::vector<int64_t> ids_b = {3, 14, 15, 92, 65, 3};
  std::vector<int32_t> single = {0, 1, 2, 3, 4, 5, 6};
  std::vector<int64_t> ids_c;
  std::vector<int32_t> many = {0};
  std::vector<float> weights_b = {0.5f, -2.0f, 1.5f, 3.0f, 0.25f, 1.0f};
  std::vector<int32_t> weighted = {0, 2, 2, 3, 4, 6};  // bags of 2, 0, 1, 1 and 2 ids
  std::vector<float> out_a, out_b, out_b2, out_c, out_c2;

  Shapes() {
    for (int bag = 0; bag < 6; ++bag) {
      for (int i = 0; i < 2 + bag * 3; ++i) ids_c.push_back(1000 + 37 * bag + 101 * i);
      many.push_back(static_cast<int32_t>(ids_c.size()));
    }
    many.insert(many.begin() + 3, many[2]);  // an empty bag among them
  }
  // One part per shape; `outputs` of a fresh set of buffers.
  std::vector<embedding::TableBags> Parts() {
    out_a.assign(ids_a.size() * 4, 0.0f);
    out_b.assign((single.size() - 1) * 8, 0.0f);
    out_b2.assign((weighted.size() - 1) * 8, 0.0f);
    out_c.assign((many.size() - 1) * 16, 0.0f);
    out_c2.assign((many.size() - 1) * 16, 0.0f);
    return {
        {"a", ids_a, {}, {}, v1::SUM, absl::MakeSpan(out_a)},
        {"b", absl::MakeSpan(ids_b).subspan(0, 6), single, {}, v1::MEAN, absl::MakeSpan(out_b)},
        {"b", ids_b, weighted, weights_b, v1::SUM, absl::MakeSpan(out_b2)},
        {"c", ids_c, many, {}, v1::SQRTN, absl::MakeSpan(out_c)},
        {"c", ids_c, many, {}, v1::MEAN, absl::MakeSpan(out_c2)},
    };
  }
  std::vector<std::vector<float>> Outputs() const { return {out_a, out_b, out_b2, out_c, out_c2}; }
};

// Gradients for every table, ids repeated within a part.
struct Grads {
  std::vector<int64_t> ids_a = {5, 77, 5, 12}, ids_b = {3, 92}, ids_c = {1000, 1101, 1000};
  std::vector<float> g_a, g_b, g_c;
  explicit Grads(float scale) {
    for (size_t i = 0; i < ids_a.size() * 4; ++i) g_a.push_back(scale * (0.1f + 0.01f * i));
    for (size_t i = 0; i < ids_b.size() * 8; ++i) g_b.push_back(scale * (0.3f - 0.02f * i));
    for (size_t i = 0; i < ids_c.size() * 16; ++i) g_c.push_back(scale * (0.05f * (i % 7) - 0.1f));
  }
  std::vector<embedding::TableGradients> Parts() const {
    return {{"a", ids_a, g_a}, {"b", ids_b, g_b}, {"c", ids_c, g_c}};
  }
};

TEST_F(ForwardingTest, ForwardedAnswersEqualTheSmartClientsAndTheInProcessTablesBitForBit) {
  auto coordinator = Connect(client::ClientOptions::Mode::kCoordinator);
  auto smart = Connect(client::ClientOptions::Mode::kSmart);
  ASSERT_NE(coordinator, nullptr);
  ASSERT_NE(smart, nullptr);
  CreateTables(*coordinator);
  Shapes shapes;
  for (int step = 0; step < 3; ++step) {
    const Grads grads(1.0f + step);
    ASSERT_TRUE(coordinator->PushBatch(grads.Parts(), step).ok());
    ASSERT_TRUE(reference_->PushBatch(grads.Parts(), step).ok());
    for (const bool insert : {true, false}) {
      embedding::LookupOptions options;
      options.insert_missing = insert;
      ASSERT_TRUE(coordinator->LookupBatch(shapes.Parts(), options).ok());
      const auto forwarded = shapes.Outputs();
      ASSERT_TRUE(smart->LookupBatch(shapes.Parts(), options).ok());
      const auto routed = shapes.Outputs();
      ASSERT_TRUE(reference_->LookupBatch(shapes.Parts(), options).ok());
      const auto in_process = shapes.Outputs();
      for (size_t p = 0; p < forwarded.size(); ++p) {
        const std::string what = absl::StrCat("step ", step, " part ", p, " insert ", insert);
        ExpectSameBits(forwarded[p], routed[p], what + ": coordinator against smart client");
        // Bags whose shards pool their shares add the shards' sums (parts 3 and 4): the
        // in-process tables add the rows in bag order, which may differ in the last bits.
        if (p < 3) ExpectSameBits(forwarded[p], in_process[p], what + ": against in process");
      }
    }
  }
}

TEST_F(ForwardingTest, TheCoordinatorForwardsItsShardsAnswersWithoutMergingThem) {
  auto c = Connect(client::ClientOptions::Mode::kCoordinator);
  ASSERT_NE(c, nullptr);
  CreateTables(*c);
  Shapes shapes;
  v1::BatchLookupRequest req;
  for (const auto& part : shapes.Parts()) {
    v1::TableLookup* t = req.add_tables();
    t->set_table(part.table);
    t->set_pooling(part.pooling);
    wire::SetPacked(part.ids, t->mutable_ids());
    wire::SetPacked(part.offsets, t->mutable_offsets());
    wire::SetPacked(part.weights, t->mutable_weights());
  }
  v1::BatchLookupResponse merged, forwarded;
  grpc::ClientContext ctx1, ctx2;
  ASSERT_TRUE(coordinator_stub_->BatchLookup(&ctx1, req, &merged).ok());
  req.set_shard_rows(true);
  ASSERT_TRUE(coordinator_stub_->BatchLookup(&ctx2, req, &forwarded).ok());
  ASSERT_EQ(forwarded.tables_size(), 5);
  for (int p = 0; p < 5; ++p) {
    const v1::TableValues& t = forwarded.tables(p);
    EXPECT_FALSE(merged.tables(p).values().empty());
    EXPECT_TRUE(t.values().empty()) << "part " << p;
    EXPECT_EQ(t.rows(), merged.tables(p).rows());
    EXPECT_GE(t.shard_values_size(), 1) << "part " << p;
    // Bags of more distinct ids than bags are pooled on the shards; the rest travel as
    // distinct rows.
    EXPECT_EQ(t.shard_pooled(), p >= 3) << "part " << p;
    if (!t.shard_pooled()) {
      EXPECT_EQ(t.row_of_ids().size(), req.tables(p).ids().size() / 2) << "part " << p;
    }
  }
  // Part 0's rows travel once each: its 5 distinct ids of 7.
  size_t bytes = 0;
  for (const std::string& block : forwarded.tables(0).shard_values()) bytes += block.size();
  EXPECT_EQ(bytes, 5 * 4 * sizeof(float));
}

// A push carried by a lookup is applied before it: the lookup reads it, exactly as the
// in-process tables do after the push alone.
TESSERA_IN_EACH_CLIENT_MODE(CarriedPushes, ForwardingTest);

TEST_P(CarriedPushes, ALookupReadsThePushItCarriesAsTheTablesDoAfterIt) {
  auto c = Connect(GetParam());
  ASSERT_NE(c, nullptr);
  CreateTables(*c);
  EXPECT_TRUE(c->FusesPushAndLookup());
  Shapes shapes;
  const int calls0 = shards_.losing[0]->calls(), calls1 = shards_.losing[1]->calls();
  for (int step = 0; step < 4; ++step) {
    const Grads grads(0.5f + step);
    std::vector<int64_t> updated, want_updated;
    embedding::PushOptions push;
    push.rows_updated = &updated;
    push.after_lookup = step > 0;  // the first step's push spans shards unchecked: apart
    ASSERT_TRUE(c->PushThenLookup(grads.Parts(), step, push, shapes.Parts()).ok());
    const auto got = shapes.Outputs();
    embedding::PushOptions reference_push;
    reference_push.rows_updated = &want_updated;
    ASSERT_TRUE(
        reference_->PushThenLookup(grads.Parts(), step, reference_push, shapes.Parts()).ok());
    const auto want = shapes.Outputs();
    EXPECT_EQ(updated, (std::vector<int64_t>{3, 2, 2})) << "step " << step;
    for (size_t p = 0; p < 3; ++p) ExpectSameBits(got[p], want[p], absl::StrCat("part ", p));
  }
  // Steps 1 to 3 took one call per shard each: the push rode on the lookup.
  EXPECT_EQ(shards_.losing[0]->calls() - calls0, 1 + 3);
  EXPECT_EQ(shards_.losing[1]->calls() - calls1, 1 + 3);
}

// Each shard applies its part of the carried push and loses the answer, twice; the
// coordinator (in its mode) loses its answer too: every repeat under the push's request id
// applies nothing again, so the rows equal the reference's with each push applied once.
TEST_P(CarriedPushes, ACarriedPushWhoseAnswersAreLostIsAppliedOnce) {
  auto c = Connect(GetParam());
  ASSERT_NE(c, nullptr);
  CreateTables(*c);
  Shapes shapes;
  for (int step = 0; step < 3; ++step) {
    shards_.losing[0]->LoseAnswers(1);
    shards_.losing[1]->LoseAnswers(2);
    losing_coordinator_->LoseAnswers(GetParam() == client::ClientOptions::Mode::kCoordinator);
    const Grads grads(1.0f);
    embedding::PushOptions push;
    push.after_lookup = true;
    ASSERT_TRUE(c->PushThenLookup(grads.Parts(), step, push, shapes.Parts()).ok());
    const auto got = shapes.Outputs();
    ASSERT_TRUE(reference_->PushThenLookup(grads.Parts(), step, {}, shapes.Parts()).ok());
    const auto want = shapes.Outputs();
    for (size_t p = 0; p < 3; ++p) ExpectSameBits(got[p], want[p], absl::StrCat("part ", p));
    EXPECT_LE(shards_.losing[0]->answers_left_to_lose(), 0);  // every loss took place
    EXPECT_LE(shards_.losing[1]->answers_left_to_lose(), 0);
    EXPECT_LE(losing_coordinator_->answers_left_to_lose(), 0);
  }
  // The rows themselves, read apart from any push.
  ASSERT_TRUE(c->LookupBatch(shapes.Parts()).ok());
  const auto got = shapes.Outputs();
  ASSERT_TRUE(reference_->LookupBatch(shapes.Parts()).ok());
  const auto want = shapes.Outputs();
  for (size_t p = 0; p < 3; ++p) ExpectSameBits(got[p], want[p], absl::StrCat("rows ", p));
}

// Requests the coordinator and a shard must refuse whole: built on a stale shard map (the
// lookup's or the push's), or carrying what cannot ride on a lookup. None applies its push.
TEST_F(ForwardingTest, AStaleMapOrAPushThatCannotRideIsRefusedBeforeAnythingIsApplied) {
  auto c = Connect(client::ClientOptions::Mode::kCoordinator);
  ASSERT_NE(c, nullptr);
  CreateTables(*c);
  Shapes shapes;
  ASSERT_TRUE(c->LookupBatch(shapes.Parts()).ok());  // rows exist, as after a lookup
  const auto before = shapes.Outputs();
  const Grads grads(3.0f);
  auto request = [&](uint64_t lookup_version, uint64_t push_version) {
    v1::BatchLookupRequest req;
    req.set_shard_map_version(lookup_version);
    req.set_shard_rows(true);
    v1::TableLookup* t = req.add_tables();
    t->set_table("a");
    wire::SetPacked(absl::MakeConstSpan(shapes.ids_a), t->mutable_ids());
    v1::BatchPushRequest* push = req.mutable_push();
    push->set_step(7);
    push->set_shard_map_version(push_version);
    push->set_after_lookup(true);
    push->mutable_request_id()->set_client_id(41);
    push->mutable_request_id()->set_sequence(1);
    v1::TableGradients* g = push->add_tables();
    g->set_table("a");
    wire::SetPacked(absl::MakeConstSpan(grads.ids_a), g->mutable_ids());
    wire::SetPacked(absl::MakeConstSpan(grads.g_a), g->mutable_gradients());
    return req;
  };
  auto call = [&](const v1::BatchLookupRequest& req) {
    grpc::ClientContext ctx;
    v1::BatchLookupResponse resp;
    return coordinator_stub_->BatchLookup(&ctx, req, &resp).error_code();
  };
  using grpc::StatusCode;
  EXPECT_EQ(call(request(2, 2)), StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(call(request(1, 2)), StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(call(request(2, 1)), StatusCode::FAILED_PRECONDITION);
  v1::BatchLookupRequest sync = request(1, 1);
  sync.mutable_push()->mutable_sync()->set_job("j");
  sync.mutable_push()->mutable_sync()->set_workers(2);
  EXPECT_EQ(call(sync), StatusCode::INVALID_ARGUMENT);
  v1::BatchLookupRequest check = request(1, 1);
  check.mutable_push()->set_check_only(true);
  EXPECT_EQ(call(check), StatusCode::INVALID_ARGUMENT);
  // Straight to each shard: the same refusals, before its part of the push is applied.
  for (int k = 0; k < kShards; ++k) {
    auto stub = v1::EmbeddingShard::NewStub(
        grpc::CreateChannel(router_->addresses()[k], grpc::InsecureChannelCredentials()));
    for (const auto& [lookup, push] : {std::pair{2, 2}, std::pair{1, 2}, std::pair{2, 1}}) {
      v1::BatchLookupRequest req = request(lookup, push);
      grpc::ClientContext ctx;
      v1::BatchLookupResponse resp;
      const grpc::Status s = stub->BatchLookup(&ctx, req, &resp);
      EXPECT_FALSE(s.ok()) << "shard " << k << " versions " << lookup << "/" << push;
      EXPECT_THAT(s.error_code(),
                  ::testing::AnyOf(StatusCode::FAILED_PRECONDITION, StatusCode::INVALID_ARGUMENT));
    }
  }
  ASSERT_TRUE(c->LookupBatch(shapes.Parts()).ok());
  const auto after = shapes.Outputs();
  for (size_t p = 0; p < 3; ++p) ExpectSameBits(after[p], before[p], absl::StrCat("part ", p));
  // The same push on the served map goes through, and changes part 0's rows.
  EXPECT_EQ(call(request(1, 1)), StatusCode::OK);
  ASSERT_TRUE(c->LookupBatch(shapes.Parts()).ok());
  EXPECT_NE(shapes.Outputs()[0], before[0]);
}

}  // namespace
}  // namespace tessera
