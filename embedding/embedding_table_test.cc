#include "embedding/embedding_table.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "base/status.h"
#include "embedding/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/table_configs.h"

namespace tessera::embedding {
namespace {

v1::TableConfig Config(int dim, v1::OptimizerType opt = v1::SGD, uint64_t seed = 7) {
  return testing::TestTable("user", dim, seed, opt, 0.1f);
}

std::unique_ptr<EmbeddingTable> Make(const v1::TableConfig& c, int64_t budget = 0) {
  auto t = EmbeddingTable::Create(c, budget);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(t).value();
}

// AlterTable's core: the next updates use the new settings, rows keep their values.
TEST(EmbeddingTable, SetOptimizerChangesTheNextUpdatesOnly) {
  auto t = Make(Config(4));  // SGD, learning rate 0.1
  const std::vector<int64_t> ids = {3, 9};
  const std::vector<float> g(8, 1.0f);
  std::vector<float> w0(8), w1(8), w2(8);
  ASSERT_TRUE(t->Lookup(ids, w0.data()).ok());
  ASSERT_TRUE(t->ApplyUniqueGradients(ids, g.data(), 1).ok());
  ASSERT_TRUE(t->Lookup(ids, w1.data()).ok());
  v1::OptimizerConfig faster = Config(4).optimizer();
  faster.set_learning_rate(0.5f);
  ASSERT_TRUE(t->SetOptimizer(faster).ok());
  ASSERT_TRUE(t->ApplyUniqueGradients(ids, g.data(), 2).ok());
  ASSERT_TRUE(t->Lookup(ids, w2.data()).ok());
  for (int i = 0; i < 8; ++i) {
    EXPECT_FLOAT_EQ(w1[i], w0[i] - 0.1f);
    EXPECT_FLOAT_EQ(w2[i], w1[i] - 0.5f);
  }
  EXPECT_EQ(t->optimizer().params().learning_rate, 0.5f);
  v1::OptimizerConfig adam = faster;
  adam.set_type(v1::ADAM);
  EXPECT_EQ(t->SetOptimizer(adam).code(), absl::StatusCode::kInvalidArgument);
}

TEST(EmbeddingTable, InitialisesRowsDeterministicallyFromSeedAndId) {
  auto a = Make(Config(8));
  auto b = Make(Config(8));
  std::vector<int64_t> ids = {5, -3, 1LL << 62, 0};
  std::vector<int64_t> reversed(ids.rbegin(), ids.rend());
  std::vector<float> ra(ids.size() * 8), rb(ids.size() * 8);
  ASSERT_TRUE(a->Lookup(ids, ra.data()).ok());
  ASSERT_TRUE(b->Lookup(reversed, rb.data()).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int j = 0; j < 8; ++j) EXPECT_EQ(ra[i * 8 + j], rb[(ids.size() - 1 - i) * 8 + j]);
  }
  // A different seed gives different rows; rows of different ids differ.
  auto c = Make(Config(8, v1::SGD, 8));
  std::vector<float> rc(ids.size() * 8);
  ASSERT_TRUE(c->Lookup(ids, rc.data()).ok());
  EXPECT_NE(ra, rc);
  EXPECT_NE(std::vector<float>(ra.begin(), ra.begin() + 8),
            std::vector<float>(ra.begin() + 8, ra.begin() + 16));
}

// The initial weights of `n` rows (ids i * stride) of a table of `dim` initialised as
// `type` with `scale`.
std::vector<float> InitialRows(v1::InitializerType type, float scale, int dim, int n,
                               int64_t stride) {
  v1::TableConfig c = Config(dim);
  c.mutable_initializer()->set_type(type);
  c.mutable_initializer()->set_scale(scale);
  auto t = Make(c);
  std::vector<int64_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = i * stride;
  std::vector<float> out(ids.size() * dim);
  EXPECT_TRUE(t->Lookup(ids, out.data()).ok());
  return out;
}

TEST(EmbeddingTable, UniformInitialiserStaysInScaleWithMeanNearZero) {
  const std::vector<float> out = InitialRows(v1::UNIFORM, 0.05f, 64, 2000, 1000003);
  double sum = 0, sq = 0;
  for (float v : out) {
    ASSERT_LE(std::fabs(v), 0.05f);
    sum += v;
    sq += v * v;
  }
  EXPECT_NEAR(sum / out.size(), 0.0, 0.001);
  EXPECT_NEAR(sq / out.size(), 0.05 * 0.05 / 3, 0.0001);  // variance of U(-a, a) = a^2 / 3
}

TEST(EmbeddingTable, NormalInitialiserHasRequestedStandardDeviation) {
  const std::vector<float> out = InitialRows(v1::NORMAL, 0.2f, 16, 4000, 1);
  double sum = 0, sq = 0;
  for (float v : out) {
    sum += v;
    sq += v * v;
  }
  const double mean = sum / out.size();
  EXPECT_NEAR(mean, 0.0, 0.005);
  EXPECT_NEAR(std::sqrt(sq / out.size() - mean * mean), 0.2, 0.005);
}

TEST(EmbeddingTable, KeepsManyIdsWithoutCollisions) {
  auto t = Make(Config(4, v1::SGD));
  constexpr int kIds = 50000;
  std::vector<int64_t> ids(kIds);
  // Ids that share low bits and sit at the edges of the 64-bit range.
  for (int i = 0; i < kIds; ++i) ids[i] = (static_cast<int64_t>(i) << 40) ^ (i % 2 ? -1LL : 0);
  std::vector<float> grads(kIds * 4);
  for (int i = 0; i < kIds; ++i) grads[i * 4] = static_cast<float>(i);
  std::vector<float> before(kIds * 4);
  ASSERT_TRUE(t->Lookup(ids, before.data()).ok());
  ASSERT_TRUE(t->ApplyUniqueGradients(ids, grads.data(), 1).ok());
  EXPECT_EQ(t->num_rows(), kIds);
  std::vector<float> after(kIds * 4);
  ASSERT_TRUE(t->Lookup(ids, after.data()).ok());
  for (int i = 0; i < kIds; ++i) {
    // Each row moved by exactly its own gradient: no two ids share a row.
    ASSERT_FLOAT_EQ(after[i * 4], before[i * 4] - 0.1f * i) << i;
    ASSERT_EQ(after[i * 4 + 1], before[i * 4 + 1]);
  }
}

TEST(EmbeddingTable, LookupWithoutInsertReturnsInitialWeightsAndStoresNothing) {
  auto t = Make(Config(8));
  std::vector<int64_t> ids = {11, 12};
  std::vector<float> peek(16), real(16);
  ASSERT_TRUE(t->Lookup(ids, peek.data(), /*insert_missing=*/false).ok());
  EXPECT_EQ(t->num_rows(), 0);
  ASSERT_TRUE(t->Lookup(ids, real.data()).ok());
  EXPECT_EQ(t->num_rows(), 2);
  EXPECT_EQ(peek, real);
  EXPECT_EQ(t->ReadRow(99).status().code(), absl::StatusCode::kNotFound);
}

// A small table costs about its rows: its 64 stripes take rows a few at a time while they
// hold few (not 64 each: 4,096 rows' memory for a table of a handful).
TEST(EmbeddingTable, ASmallTableTakesMemoryForAboutItsRows) {
  auto t = Make(Config(16, v1::ADAGRAD));
  std::vector<int64_t> ids(200);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i) * 7919 + 3;
  std::vector<float> out(ids.size() * 16);
  ASSERT_TRUE(t->Lookup(ids, out.data()).ok());
  ASSERT_EQ(t->num_rows(), 200);
  EXPECT_LE(t->MemoryBytes(), 4 * 200 * t->row_bytes())
      << "row bytes " << t->row_bytes() << ", taken " << t->MemoryBytes();
  // Rows keep their own values however the blocks were cut.
  std::vector<float> again(out.size());
  ASSERT_TRUE(t->Lookup(ids, again.data()).ok());
  EXPECT_EQ(again, out);
}

TEST(EmbeddingTable, RowBudgetGivesExplicitErrorWhenFull) {
  auto t = Make(Config(4), /*budget=*/3);
  std::vector<float> out(4 * 4);
  std::vector<int64_t> three = {1, 2, 3};
  ASSERT_TRUE(t->Lookup(three, out.data()).ok());
  std::vector<int64_t> again = {3, 1};
  EXPECT_TRUE(t->Lookup(again, out.data()).ok()) << "existing rows stay readable";
  std::vector<int64_t> four = {4};
  absl::Status s = t->Lookup(four, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("row budget of 3 rows is full"));
  // Shards split a table's max_rows: adding shards adds no rows, so it is not advised.
  EXPECT_THAT(std::string(s.message()), ::testing::Not(::testing::HasSubstr("add shards")));
  EXPECT_EQ(t->num_rows(), 3);

  // An update batch that needs a new row is rejected whole: existing rows do not move.
  auto before = t->ReadRow(1);
  ASSERT_TRUE(before.ok());
  std::vector<int64_t> mixed = {1, 5};
  std::vector<float> g(8, 1.0f);
  EXPECT_EQ(t->ApplyUniqueGradients(mixed, g.data(), 1).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(t->ReadRow(1)->weights, before->weights);
  EXPECT_EQ(t->num_rows(), 3);
}

TEST(EmbeddingTable, NonFiniteGradientIsRejectedAndRowUntouched) {
  auto t = Make(Config(4, v1::ADAGRAD));
  std::vector<int64_t> ids = {1, 2};
  std::vector<float> out(8);
  ASSERT_TRUE(t->Lookup(ids, out.data()).ok());
  auto r1 = t->ReadRow(1);
  auto r2 = t->ReadRow(2);
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> g = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, bad, 0.1f, 0.1f};
    absl::Status s = t->PushGradients(ids, g.data(), 3);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("gradient for id 2"));
    EXPECT_EQ(t->ReadRow(1)->weights, r1->weights);
    EXPECT_EQ(t->ReadRow(1)->state, r1->state);
    EXPECT_EQ(t->ReadRow(2)->weights, r2->weights);
    EXPECT_EQ(t->ReadRow(2)->meta.update_count, 0);
  }
}

// Finite gradients whose update overflows: SGD at lr 10 on 1e38, Adagrad's accumulator
// on 1e20 squared. The overflowing rows keep their values, the others are updated.
TEST(EmbeddingTable, AnUpdateThatWouldOverflowLeavesItsRowAndSaysSo) {
  for (v1::OptimizerType opt : {v1::SGD, v1::ADAGRAD}) {
    for (v1::Dtype dtype : {v1::FP32, v1::BF16}) {
      v1::TableConfig c = Config(2, opt);
      c.mutable_optimizer()->set_learning_rate(10.0f);
      c.set_dtype(dtype);
      auto t = Make(c);
      const std::vector<int64_t> ids = {1, 2, 3};
      const float huge = opt == v1::SGD ? 1e38f : 1e20f;
      const std::vector<float> g = {0.1f, 0.1f, huge, -huge, 0.2f, 0.2f};
      std::vector<float> before(6), after(6);
      ASSERT_TRUE(t->Lookup(ids, before.data()).ok());
      const auto state2 = t->ReadRow(2)->state;
      absl::Status s = t->PushGradients(ids, g.data(), 5);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_TRUE(IsPartlyApplied(s));
      EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("(id 2 first) would make"));
      ASSERT_TRUE(t->Lookup(ids, after.data()).ok());
      for (float v : after) EXPECT_TRUE(std::isfinite(v));
      EXPECT_EQ(after[2], before[2]);
      EXPECT_EQ(after[3], before[3]);
      EXPECT_EQ(t->ReadRow(2)->state, state2);
      EXPECT_EQ(t->ReadRow(2)->meta.update_count, 0);
      EXPECT_NE(after[0], before[0]);  // the finite rows moved
      EXPECT_NE(after[4], before[4]);
      EXPECT_EQ(t->ReadRow(3)->meta.update_count, 1);
    }
  }
}

TEST(EmbeddingTable, PushSumsRepeatedIdsAndUpdatesOnce) {
  auto t = Make(Config(2, v1::ADAGRAD));
  std::vector<int64_t> ids = {9, 9, 9};
  std::vector<float> g = {1.0f, 0.0f, 2.0f, 1.0f, 0.5f, 0.0f};
  std::vector<float> w0(2);
  t->InitialWeights(9, w0.data());
  ASSERT_TRUE(t->PushGradients(ids, g.data(), 4).ok());
  auto row = t->ReadRow(9);
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->meta.update_count, 1);
  EXPECT_EQ(row->meta.last_step, 4);
  // One Adagrad step on the sum (3.5, 1.0) from a zero accumulator.
  EXPECT_NEAR(row->state[0], 3.5 * 3.5, 1e-5);
  EXPECT_NEAR(row->weights[0], w0[0] - 0.1 * 3.5 / 3.5, 1e-6);
  EXPECT_NEAR(row->weights[1], w0[1] - 0.1 * 1.0 / 1.0, 1e-6);
}

TEST(EmbeddingTable, ConcurrentLookupsAndUpdatesLoseNoUpdate) {
  // SGD with lr 0.1 and gradient -1 per push: every applied push adds exactly 0.1.
  v1::TableConfig c = Config(16, v1::SGD);
  c.mutable_initializer()->set_type(v1::ZEROS);
  auto t = Make(c);
  constexpr int kThreads = 4;
  constexpr int kRounds = 300;
  constexpr int kIds = 64;
  std::vector<std::thread> threads;
  std::atomic<bool> torn{false};
  for (int w = 0; w < kThreads; ++w) {
    threads.emplace_back([&, w] {
      std::vector<int64_t> ids(kIds);
      for (int i = 0; i < kIds; ++i) ids[i] = i * 31 + 1;
      std::vector<float> grads(kIds * 16, -1.0f);
      std::vector<float> out(kIds * 16);
      for (int r = 0; r < kRounds; ++r) {
        if (w % 2 == 0) {
          ASSERT_TRUE(t->ApplyUniqueGradients(ids, grads.data(), r).ok());
        } else {
          ASSERT_TRUE(t->Lookup(ids, out.data()).ok());
          // A row is never seen half-updated: all its columns are equal.
          for (int i = 0; i < kIds; ++i) {
            for (int j = 1; j < 16; ++j) {
              if (out[i * 16 + j] != out[i * 16]) torn = true;
            }
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_FALSE(torn);
  EXPECT_EQ(t->num_rows(), kIds);
  const int updaters = (kThreads + 1) / 2;
  for (int i = 0; i < kIds; ++i) {
    auto row = t->ReadRow(i * 31 + 1);
    ASSERT_TRUE(row.ok());
    EXPECT_EQ(row->meta.update_count, updaters * kRounds);
    EXPECT_NEAR(row->weights[3], 0.1 * updaters * kRounds, 1e-2);
  }
}

TEST(EmbeddingTable, ForEachRowVisitsEveryStoredRow) {
  auto t = Make(Config(4));
  std::vector<int64_t> ids = {3, 1, 4, 1, 5, 9, 2, 6};
  std::vector<float> out(ids.size() * 4);
  ASSERT_TRUE(t->Lookup(ids, out.data()).ok());
  std::set<int64_t> seen;
  t->ForEachRow([&](int64_t id, const float* w, const float*, const RowMeta&) {
    seen.insert(id);
    std::vector<float> init(4);
    t->InitialWeights(id, init.data());
    EXPECT_EQ(std::vector<float>(w, w + 4), init);
  });
  EXPECT_EQ(seen, (std::set<int64_t>{1, 2, 3, 4, 5, 6, 9}));
  EXPECT_GT(t->MemoryBytes(), 7 * 4 * 4);
}

TEST(EmbeddingTable, OnlyUpdatedRowsAreDirtyUntilCleared) {
  auto t = Make(Config(4, v1::ADAGRAD));
  std::vector<float> out(3 * 4);
  ASSERT_TRUE(t->Lookup({1, 2, 3}, out.data()).ok());
  EXPECT_EQ(t->DirtyRows(), 0);  // looked up only: equal to their initial weights
  std::vector<float> g(2 * 4, 0.5f);
  ASSERT_TRUE(t->PushGradients({2, 9}, g.data(), 4).ok());
  ASSERT_TRUE(t->PushGradients({2}, g.data(), 5).ok());  // already dirty: listed once
  std::set<int64_t> dirty;
  t->ForEachDirtyRow([&](int64_t id, const float*, const float*, const RowMeta& m) {
    EXPECT_TRUE(dirty.insert(id).second);
    EXPECT_EQ(m.last_step, id == 2 ? 5 : 4);
  });
  EXPECT_EQ(dirty, (std::set<int64_t>{2, 9}));
  EXPECT_EQ(t->DirtyRows(), 2);
  t->ClearDirty();
  EXPECT_EQ(t->DirtyRows(), 0);
  ASSERT_TRUE(t->PushGradients({9}, g.data(), 6).ok());
  EXPECT_EQ(t->DirtyRows(), 1);
}

TEST(EmbeddingTable, PutRowStoresExactlyWhatItIsGivenAndHonoursTheBudget) {
  auto t = Make(Config(3, v1::ADAGRAD), /*budget=*/2);
  const int state = t->optimizer().StateFloats();
  std::vector<float> w = {1.5f, -2.0f, 0.25f};
  std::vector<float> st(state, 7.0f);
  ASSERT_TRUE(t->PutRow(42, w, st, RowMeta{11, 3}).ok());
  absl::StatusOr<RowSnapshot> row = t->ReadRow(42);
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->weights, w);
  EXPECT_EQ(row->state, st);
  EXPECT_EQ(row->meta.last_step, 11);
  EXPECT_EQ(row->meta.update_count, 3);
  EXPECT_EQ(t->DirtyRows(), 0);
  // Overwriting does not take budget; a third new row does.
  ASSERT_TRUE(t->PutRow(42, {0, 0, 0}, st, RowMeta{}).ok());
  ASSERT_TRUE(t->PutRow(43, w, st, RowMeta{}).ok());
  EXPECT_EQ(t->PutRow(44, w, st, RowMeta{}).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(t->PutRow(45, {1, 2}, st, RowMeta{}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->num_rows(), 2);
  std::vector<int64_t> seen;
  t->ReadRows({43, 44, 42}, [&](int64_t id, const float* weights, const float*, const RowMeta&) {
    seen.push_back(id);
    if (id == 42) {
      EXPECT_EQ(weights[0], 0.0f);
    }
  });
  EXPECT_EQ(seen, (std::vector<int64_t>{43, 42}));
}

v1::TableConfig Evicting(v1::EvictionPolicy policy, int64_t max_rows, int64_t ttl = 0) {
  v1::TableConfig c = Config(4, v1::ADAGRAD);
  c.set_max_rows(max_rows);
  c.mutable_eviction()->set_policy(policy);
  c.mutable_eviction()->set_ttl_steps(ttl);
  return c;
}

// Every id in [0, n) is either a stored row that ReadRow finds, or not stored; the map
// stays consistent through evictions (backward-shift deletion, reused rows).
void ExpectConsistent(const EmbeddingTable& t, int64_t n) {
  int64_t found = 0;
  for (int64_t id = 0; id < n; ++id) found += t.ReadRow(id).ok();
  int64_t visited = 0;
  t.ForEachRow([&](int64_t, const float*, const float*, const RowMeta&) { ++visited; });
  EXPECT_EQ(found, t.num_rows());
  EXPECT_EQ(visited, t.num_rows());
}

TEST(EmbeddingTable, LruEvictionKeepsRecentlyUpdatedRowsWithinTheBudget) {
  constexpr int64_t kBudget = 6400, kIds = 30000;
  auto t = Make(Evicting(v1::EVICTION_LRU, kBudget), kBudget);
  std::vector<float> g(4, 0.1f);
  for (int64_t id = 0; id < kIds; ++id) ASSERT_TRUE(t->PushGradients({id}, g.data(), id).ok());
  EXPECT_LE(t->num_rows(), kBudget);
  EXPECT_GE(t->num_rows(), kBudget - EmbeddingTable::kNumStripes);
  EXPECT_EQ(t->evictions(), kIds - t->num_rows());
  int64_t recent_kept = 0, old_kept = 0;
  for (int64_t id = kIds - 1000; id < kIds; ++id) recent_kept += t->ReadRow(id).ok();
  for (int64_t id = 0; id < 1000; ++id) old_kept += t->ReadRow(id).ok();
  EXPECT_GE(recent_kept, 950);  // sampled LRU: the newest rows survive
  EXPECT_EQ(old_kept, 0);
  ExpectConsistent(*t, kIds);
}

TEST(EmbeddingTable, LfuEvictionKeepsFrequentlyUpdatedRows) {
  constexpr int64_t kBudget = 3200;
  auto t = Make(Evicting(v1::EVICTION_LFU, kBudget), kBudget);
  std::vector<float> g(4, 0.1f);
  // Ids [0, 500) are hot: updated 5 times each before a stream of one-off ids.
  for (int r = 0; r < 5; ++r) {
    for (int64_t id = 0; id < 500; ++id) ASSERT_TRUE(t->PushGradients({id}, g.data(), r).ok());
  }
  for (int64_t id = 1000; id < 20000; ++id) ASSERT_TRUE(t->PushGradients({id}, g.data(), 9).ok());
  int64_t hot_kept = 0;
  for (int64_t id = 0; id < 500; ++id) hot_kept += t->ReadRow(id).ok();
  EXPECT_GE(hot_kept, 490);
  EXPECT_LE(t->num_rows(), kBudget);
  ExpectConsistent(*t, 20000);
}

TEST(EmbeddingTable, WithoutEvictionAFullTableStillRefuses) {
  auto t = Make(Evicting(v1::EVICTION_NONE, 10), 10);
  std::vector<float> g(11 * 4, 0.1f);
  std::vector<int64_t> ids(11);
  for (int i = 0; i < 11; ++i) ids[i] = i;
  EXPECT_EQ(t->PushGradients(ids, g.data(), 1).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(t->num_rows(), 0);
}

TEST(EmbeddingTable, TtlDropsRowsNotUpdatedForKSteps) {
  auto t = Make(Evicting(v1::EVICTION_NONE, 0, /*ttl=*/10));
  std::vector<float> g(4, 0.1f);
  for (int64_t id = 0; id < 100; ++id) ASSERT_TRUE(t->PushGradients({id}, g.data(), 0).ok());
  // Ids [0, 10) keep being updated; the rest are last touched at step 0.
  for (int64_t step = 1; step <= 30; ++step) {
    for (int64_t id = 0; id < 10; ++id) ASSERT_TRUE(t->PushGradients({id}, g.data(), step).ok());
  }
  EXPECT_EQ(t->num_rows(), 10);
  EXPECT_EQ(t->expirations(), 90);
  for (int64_t id = 0; id < 10; ++id) EXPECT_TRUE(t->ReadRow(id).ok());
  EXPECT_FALSE(t->ReadRow(50).ok());
  // An expired row starts again from its initial weights.
  std::vector<float> row(4), initial(4);
  ASSERT_TRUE(t->Lookup({50}, row.data()).ok());
  t->InitialWeights(50, initial.data());
  EXPECT_EQ(row, initial);
  ExpectConsistent(*t, 100);
}

TEST(EmbeddingTable, ConcurrentPushesAndLookupsOnAnEvictingTableKeepItConsistent) {
  constexpr int64_t kBudget = 2000, kIds = 20000;
  auto t = Make(Evicting(v1::EVICTION_LRU, kBudget), kBudget);
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&t, w] {
      std::mt19937_64 rng(w);
      std::vector<int64_t> ids(16);
      std::vector<float> g(16 * 4, 0.01f), out(16 * 4);
      for (int i = 0; i < 1500; ++i) {
        for (auto& id : ids) id = static_cast<int64_t>(rng() % kIds);
        if (i % 2) {
          ASSERT_TRUE(t->PushGradients(ids, g.data(), i).ok());
        } else {
          ASSERT_TRUE(t->Lookup(ids, out.data()).ok());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_LE(t->num_rows(), kBudget + EmbeddingTable::kNumStripes);
  ExpectConsistent(*t, kIds);
}

TEST(EmbeddingTable, EvictionConfigIsValidated) {
  v1::TableConfig c = Evicting(v1::EVICTION_LRU, 0);
  EXPECT_EQ(EmbeddingTable::Create(c).status().code(), absl::StatusCode::kInvalidArgument);
  c = Evicting(v1::EVICTION_NONE, 0, -1);
  EXPECT_EQ(EmbeddingTable::Create(c).status().code(), absl::StatusCode::kInvalidArgument);
}

v1::TableConfig HalfConfig(v1::Dtype dtype, int dim, v1::OptimizerType opt = v1::SGD) {
  v1::TableConfig c = Config(dim, opt);
  c.set_dtype(dtype);
  return c;
}

TEST(EmbeddingTable, HalfTablesStartFromTheRoundedFp32RowsInLessMemory) {
  auto full = Make(Config(64));
  std::vector<int64_t> ids(4096);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i) * 7919 - 100000;
  std::vector<float> want(ids.size() * 64);
  ASSERT_TRUE(full->Lookup(ids, want.data()).ok());
  for (const v1::Dtype d : {v1::BF16, v1::FP16}) {
    auto half = Make(HalfConfig(d, 64));
    std::vector<float> got(ids.size() * 64), peek(64);
    half->InitialWeights(ids[3], peek.data());  // before the row exists
    ASSERT_TRUE(half->Lookup(ids, got.data()).ok());
    for (size_t i = 0; i < got.size(); ++i) {
      // Rounded to nearest: within half a unit in the last place of the fp32 value.
      const float ulp = d == v1::BF16 ? 0x1p-8f : 0x1p-11f;
      ASSERT_LE(std::fabs(got[i] - want[i]), std::fabs(want[i]) * ulp + 1e-7f) << i;
    }
    EXPECT_EQ(peek, std::vector<float>(got.begin() + 3 * 64, got.begin() + 4 * 64));
    EXPECT_NE(got, want);
    absl::StatusOr<RowSnapshot> row = half->ReadRow(ids[5]);
    ASSERT_TRUE(row.ok());
    EXPECT_EQ(row->weights, std::vector<float>(got.begin() + 5 * 64, got.begin() + 6 * 64));
    // SGD rows of dim 64: 192 bytes instead of 320 (plus the same id map).
    EXPECT_LT(half->MemoryBytes(), full->MemoryBytes() * 3 / 4) << DtypeName(d);
  }
}

// Each step moves the weight by a fifth (bf16) or a fiftieth (fp16) of its rounding step:
// rounding to nearest would keep every row at 1 forever.
TEST(EmbeddingTable, HalfTablesKeepUpdatesSmallerThanTheirPrecisionOnAverage) {
  for (const v1::Dtype d : {v1::BF16, v1::FP16}) {
    auto t = Make(HalfConfig(d, 4));  // SGD, lr 0.1
    const int kRows = 2000, kSteps = 100;
    const float grad = d == v1::BF16 ? 1e-2f : 1e-4f;
    std::vector<int64_t> ids(kRows);
    for (int i = 0; i < kRows; ++i) {
      ids[i] = i;
      ASSERT_TRUE(t->PutRow(i, std::vector<float>(4, 1.0f), {}, RowMeta{}).ok());
    }
    std::vector<float> grads(kRows * 4, grad);
    for (int s = 0; s < kSteps; ++s)
      ASSERT_TRUE(t->ApplyUniqueGradients(ids, grads.data(), s).ok());
    std::vector<float> out(kRows * 4);
    ASSERT_TRUE(t->Lookup(ids, out.data()).ok());
    double sum = 0;
    for (const float f : out) sum += f;
    const double want = 1.0 - 0.1 * grad * kSteps;
    EXPECT_NEAR(sum / out.size(), want, 0.1 * (1.0 - want)) << DtypeName(d);
  }
}

TEST(EmbeddingTable, HalfTableUpdatesReplayBitForBitHoweverTheBatchIsSplit) {
  auto whole = Make(HalfConfig(v1::BF16, 16, v1::ADAGRAD));
  auto split = Make(HalfConfig(v1::BF16, 16, v1::ADAGRAD));
  auto full = Make(Config(16, v1::ADAGRAD));
  std::vector<int64_t> ids(200);
  std::vector<float> grads(200 * 16);
  for (int i = 0; i < 200; ++i) ids[i] = i * 31 + 5;
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.001f * static_cast<float>(i % 97) - 0.04f;
  for (int s = 0; s < 5; ++s) {
    ASSERT_TRUE(whole->ApplyUniqueGradients(ids, grads.data(), s).ok());
    ASSERT_TRUE(full->ApplyUniqueGradients(ids, grads.data(), s).ok());
    absl::Span<const int64_t> all(ids);
    ASSERT_TRUE(split->ApplyUniqueGradients(all.subspan(120), grads.data() + 120 * 16, s).ok());
    ASSERT_TRUE(split->ApplyUniqueGradients(all.subspan(0, 120), grads.data(), s).ok());
  }
  std::vector<float> a(200 * 16), b(200 * 16);
  ASSERT_TRUE(whole->Lookup(ids, a.data()).ok());
  ASSERT_TRUE(split->Lookup(ids, b.data()).ok());
  EXPECT_EQ(a, b);
  for (const int64_t id : {ids[0], ids[150]}) {
    // The accumulator is fp32 and depends on the gradients alone: equal to the fp32 table's.
    EXPECT_EQ(whole->ReadRow(id)->state, full->ReadRow(id)->state);
    EXPECT_EQ(whole->ReadRow(id)->meta.update_count, 5);
  }
  // The callbacks see the same widened weights the lookups return.
  int seen = 0;
  whole->ForEachDirtyRow([&](int64_t id, const float* w, const float*, const RowMeta&) {
    const size_t at = std::find(ids.begin(), ids.end(), id) - ids.begin();
    ASSERT_LT(at, ids.size());
    EXPECT_EQ(std::vector<float>(w, w + 16),
              std::vector<float>(a.begin() + at * 16, a.begin() + at * 16 + 16));
    ++seen;
  });
  EXPECT_EQ(seen, 200);
}

TEST(EmbeddingTable, HalfTablesStoreWhatPutRowGivesRounded) {
  auto t = Make(HalfConfig(v1::FP16, 4, v1::ADAM));
  const std::vector<float> w = {0.5f, -0.25f, 1e6f, 1.0f / 3};
  const std::vector<float> state = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_TRUE(t->PutRow(9, w, state, RowMeta{3, 4}).ok());
  absl::StatusOr<RowSnapshot> row = t->ReadRow(9);
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->weights[0], 0.5f);
  EXPECT_EQ(row->weights[1], -0.25f);
  EXPECT_EQ(row->weights[2], 65504.0f);
  EXPECT_EQ(row->weights[3], 0.333251953125f);  // 1/3 in binary16: 0x3555
  EXPECT_EQ(row->state, state);
  EXPECT_EQ(row->meta.update_count, 4);
  v1::TableConfig bad = HalfConfig(v1::FP16, 4);
  bad.set_dtype(static_cast<v1::Dtype>(7));
  EXPECT_EQ(EmbeddingTable::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(EmbeddingTable, RejectsBadConfigs) {
  v1::TableConfig c = Config(0);
  EXPECT_EQ(EmbeddingTable::Create(c).status().code(), absl::StatusCode::kInvalidArgument);
  c = Config(4);
  c.set_name("");
  EXPECT_EQ(EmbeddingTable::Create(c).status().code(), absl::StatusCode::kInvalidArgument);
  // Names are checked as model names are: no spaces, slashes or empty dotted parts.
  for (const char* bad : {"bad name/..", "a/b", "a..b", ".a", "a.", "tab\tle"}) {
    c.set_name(bad);
    const absl::Status named = EmbeddingTable::Create(c).status();
    EXPECT_EQ(named.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(named.message()), ::testing::HasSubstr("use letters, digits")) << bad;
  }
  for (const char* good : {"user", "criteo.C1", "ads-v2.item_id"}) {
    c.set_name(good);
    EXPECT_TRUE(EmbeddingTable::Create(c).ok()) << good;
  }
  c = Config(4);
  c.mutable_optimizer()->set_learning_rate(0.0f);
  auto s = EmbeddingTable::Create(c).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("table 'user'"));
}

}  // namespace
}  // namespace tessera::embedding
