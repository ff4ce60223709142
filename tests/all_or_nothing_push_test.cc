// A push spanning shards is one unit: refused by one shard (its batch limit, its memory
// budget), it changes no row on any shard, in both client modes; failing on one shard after
// another applied its part, the error names the parts applied, and the same request id
// again applies only the rest.

#include <algorithm>
#include <numeric>
#include <random>

#include "client/embedding_client.h"
#include "embedding/inprocess_collection.h"
#include "embedding/sharding.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/coordinator_service.h"
#include "server/shard_service.h"
#include "tests/support/answer_loser.h"
#include "tests/support/local_server.h"
#include "tests/support/table_configs.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using Mode = client::ClientOptions::Mode;

constexpr int kShards = 2;
constexpr int kDim = 4;
constexpr int64_t kShard0BatchLimit = 1000;    // ids a request to shard 0 may carry
constexpr int64_t kShard1MemoryLimit = 40000;  // bytes shard 1's rows may take

v1::TableConfig Sgd(const std::string& name) {
  return testing::TestTable(name, kDim, 5, v1::SGD, 1.0f);
}

class AllOrNothingPushTest : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    std::vector<std::string> addresses;
    for (int k = 0; k < kShards; ++k) {
      embedding::InProcessOptions io;
      io.memory_limit = k == 1 ? kShard1MemoryLimit : -1;
      tables_.push_back(std::move(embedding::NewInProcessCollection(io)).value());
      server::ShardOptions o;
      o.shard_index = k;
      o.num_shards = kShards;
      if (k == 0) o.max_batch_ids = kShard0BatchLimit;
      shards_.push_back(std::make_unique<server::ShardService>(tables_[k].get(), o));
      losers_.push_back(std::make_unique<testing::AnswerLoser>(
          std::vector<std::string>{"/BatchPush", "/PushGradients"}));
      int port = 0;
      servers_.push_back(testing::StartLocalServer(shards_[k].get(), &port, losers_[k].get()));
      ASSERT_NE(servers_.back(), nullptr);
      addresses.push_back(testing::LocalAddress(port));
    }
    client::RouterOptions ro;
    ro.deadline = std::chrono::milliseconds(3000);
    ro.retry.max_retries = 2;
    ro.retry.initial_backoff = std::chrono::milliseconds(10);
    router_ = std::make_unique<client::ShardRouter>(addresses, ro);
    coordinator_ = std::make_unique<server::CoordinatorService>(router_.get(), 1,
                                                                server::CoordinatorOptions());
    int port = 0;
    coordinator_server_ = testing::StartLocalServer(coordinator_.get(), &port);
    ASSERT_NE(coordinator_server_, nullptr);
    client::ClientOptions co;
    co.mode = GetParam();
    co.deadline = std::chrono::milliseconds(5000);
    co.retry.max_retries = 1;
    co.retry.initial_backoff = std::chrono::milliseconds(10);
    auto c = client::EmbeddingClient::Connect(testing::LocalAddress(port), co);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(c).value();
    ASSERT_TRUE(client_->CreateTable(Sgd("t")).ok());
    reference_ = std::move(embedding::NewInProcessCollection(kShards)).value();
    ASSERT_TRUE(reference_->CreateTable(Sgd("t")).ok());
  }
  void TearDown() override {
    if (coordinator_server_) coordinator_server_->Shutdown();
    for (auto& s : servers_) {
      if (s) s->Shutdown();
    }
  }

  // `per_shard` distinct ids owned by each shard (shard 0's first), from `first` on.
  static std::vector<int64_t> Ids(const std::vector<int64_t>& per_shard, int64_t first = 1) {
    std::vector<int64_t> ids;
    std::vector<int64_t> left = per_shard;
    for (int64_t id = first; std::accumulate(left.begin(), left.end(), int64_t{0}) > 0; ++id) {
      const int k = embedding::ShardOfRow(Sgd("t"), id, kShards);
      if (left[k] > 0) {
        --left[k];
        ids.push_back(id);
      }
    }
    return ids;
  }

  static std::vector<float> Gradients(size_t ids) {
    std::vector<float> g(ids * kDim);
    std::mt19937 rng(3);
    for (float& x : g) x = static_cast<float>(static_cast<int>(rng() % 200) - 100) / 64.0f;
    return g;
  }

  // The rows of `ids` read without creating any, from the cluster and from the reference
  // (in requests within shard 0's batch limit).
  void ExpectRowsEqualReference(const std::vector<int64_t>& ids) {
    embedding::LookupOptions read;
    read.insert_missing = false;
    for (size_t begin = 0; begin < ids.size(); begin += 500) {
      const std::vector<int64_t> part(ids.begin() + begin,
                                      ids.begin() + std::min(ids.size(), begin + 500));
      std::vector<float> got(part.size() * kDim), want(part.size() * kDim);
      const absl::Status s = client_->Lookup("t", part, absl::MakeSpan(got), read);
      ASSERT_TRUE(s.ok()) << s;
      ASSERT_TRUE(reference_->Lookup("t", part, absl::MakeSpan(want), read).ok());
      ASSERT_EQ(got, want) << "ids from " << begin;
    }
  }

  absl::Status Push(const std::vector<int64_t>& ids, const std::vector<float>& grads,
                    const embedding::PushOptions& options = {}) {
    const embedding::TableGradients part{"t", ids, grads};
    return client_->PushBatch({&part, 1}, 1, options);
  }

  std::vector<std::unique_ptr<embedding::InProcessCollection>> tables_;
  std::vector<std::unique_ptr<server::ShardService>> shards_;
  std::vector<std::unique_ptr<testing::AnswerLoser>> losers_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
  std::unique_ptr<client::ShardRouter> router_;
  std::unique_ptr<server::CoordinatorService> coordinator_;
  std::unique_ptr<grpc::Server> coordinator_server_;
  std::unique_ptr<client::EmbeddingClient> client_;
  std::unique_ptr<embedding::InProcessCollection> reference_;
};

TEST_P(AllOrNothingPushTest, APushOverOneShardsBatchLimitChangesNoRowOnAnyShard) {
  // Shard 1 could take its part; shard 0's part is over its --max_batch_ids.
  const std::vector<int64_t> ids = Ids({kShard0BatchLimit + 500, 100});
  const absl::Status s = Push(ids, Gradients(ids.size()));
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("no shard applied it"));
  ExpectRowsEqualReference(ids);

  // Split as the message advises, each half applies once: rows equal one application.
  const std::vector<float> grads = Gradients(ids.size());
  const size_t half = ids.size() / 2;
  const std::vector<int64_t> a(ids.begin(), ids.begin() + half), b(ids.begin() + half, ids.end());
  const std::vector<float> ga(grads.begin(), grads.begin() + half * kDim),
      gb(grads.begin() + half * kDim, grads.end());
  ASSERT_TRUE(Push(a, ga).ok());
  ASSERT_TRUE(Push(b, gb).ok());
  ASSERT_TRUE(reference_->PushGradients("t", ids, grads, 1).ok());
  ExpectRowsEqualReference(ids);
}

TEST_P(AllOrNothingPushTest, APushOverOneShardsMemoryBudgetChangesNoRowOnAnyShard) {
  // Shard 0 has no budget; shard 1's rows cannot take 3,000 new ones.
  const std::vector<int64_t> ids = Ids({3000, 3000});
  const absl::Status s = Push(ids, Gradients(ids.size()));
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  ExpectRowsEqualReference(ids);
  // Rows that fit on both shards still apply, once.
  const std::vector<int64_t> few = Ids({20, 20}, 1000000);
  const std::vector<float> grads = Gradients(few.size());
  const absl::Status pushed = Push(few, grads);
  ASSERT_TRUE(pushed.ok()) << pushed;
  ASSERT_TRUE(reference_->PushGradients("t", few, grads, 1).ok());
  ExpectRowsEqualReference(few);
  ExpectRowsEqualReference(ids);
}

TEST_P(AllOrNothingPushTest, APushThatFailsOnOneShardAfterAnotherAppliedNamesThemAndCompletes) {
  const std::vector<int64_t> ids = Ids({50, 50});
  const std::vector<float> grads = Gradients(ids.size());
  std::vector<float> rows(ids.size() * kDim);
  ASSERT_TRUE(client_->Lookup("t", ids, absl::MakeSpan(rows), {}).ok());
  // The lookup made the rows: no check round. Shard 1 is unreachable for the push's
  // every attempt (the router's and the client's retries).
  losers_[1]->RefuseNext("/BatchPush", 1000);
  embedding::PushOptions options;
  options.after_lookup = true;
  options.request_id = {77, 1};
  const absl::Status s = Push(ids, grads, options);
  ASSERT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("push 77:1 was applied on shard(s) 0"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("but not on 1"));
  losers_[1]->RefuseNext("/BatchPush", 0);
  // Again under the same id: shard 0 answers from its journal, shard 1 applies its part.
  ASSERT_TRUE(Push(ids, grads, options).ok());
  ASSERT_TRUE(reference_->PushGradients("t", ids, grads, 1).ok());
  ExpectRowsEqualReference(ids);
}

// The check round costs one more call to each shard, for pushes whose rows no lookup of the
// caller made; a push after its lookup (a trainer's) goes to each shard once.
TEST_P(AllOrNothingPushTest, OnlyAPushWithoutItsLookupIsCheckedFirst) {
  const std::vector<int64_t> ids = Ids({30, 30});
  const std::vector<float> grads = Gradients(ids.size());
  std::vector<float> rows(ids.size() * kDim);
  ASSERT_TRUE(client_->Lookup("t", ids, absl::MakeSpan(rows), {}).ok());
  int before = losers_[0]->calls() + losers_[1]->calls();
  ASSERT_TRUE(Push(ids, grads).ok());
  EXPECT_EQ(losers_[0]->calls() + losers_[1]->calls() - before, 4) << "check and push, each shard";
  embedding::PushOptions options;
  options.after_lookup = true;
  before = losers_[0]->calls() + losers_[1]->calls();
  ASSERT_TRUE(Push(ids, grads, options).ok());
  EXPECT_EQ(losers_[0]->calls() + losers_[1]->calls() - before, 2) << "one push a shard";
  ASSERT_TRUE(reference_->PushGradients("t", ids, grads, 1).ok());
  ASSERT_TRUE(reference_->PushGradients("t", ids, grads, 1).ok());
  ExpectRowsEqualReference(ids);
}

INSTANTIATE_TEST_SUITE_P(BothModes, AllOrNothingPushTest,
                         ::testing::Values(Mode::kSmart, Mode::kCoordinator),
                         [](const ::testing::TestParamInfo<Mode>& info) {
                           return info.param == Mode::kSmart ? "Smart" : "Coordinator";
                         });

}  // namespace
}  // namespace tessera
