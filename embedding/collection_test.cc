#include "embedding/collection.h"

#include <cmath>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "embedding/embedding_table.h"
#include "embedding/inprocess_collection.h"
#include "embedding/sharding.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/stored_rows.h"
#include "tests/support/table_configs.h"

namespace tessera::embedding {
namespace {

v1::TableConfig Config(const std::string& name, int dim, v1::OptimizerType opt = v1::ADAGRAD) {
  return testing::TestTable(name, dim, 1234, opt, 0.05f);
}

std::unique_ptr<InProcessCollection> Make(int shards) {
  auto c = NewInProcessCollection(shards);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

// Runs the same stream of lookups and pushes and returns every lookup's output.
std::vector<float> Replay(EmbeddingCollection& c) {
  std::mt19937_64 rng(5);
  std::vector<float> all;
  for (int step = 0; step < 20; ++step) {
    std::vector<int64_t> ids(200);
    for (auto& id : ids) id = static_cast<int64_t>(rng() % 500) * 0x9E3779B97F4A7C15LL;
    std::vector<int32_t> offsets;
    for (int b = 0; b <= 50; ++b) offsets.push_back(b * 4);
    std::vector<float> pooled(50 * 8);
    EXPECT_TRUE(c.PooledLookup("t", ids, offsets, {}, v1::MEAN, absl::MakeSpan(pooled)).ok());
    all.insert(all.end(), pooled.begin(), pooled.end());
    std::vector<float> grads(ids.size() * 8);
    for (auto& g : grads) g = static_cast<float>(static_cast<int64_t>(rng() % 2001) - 1000) / 1000;
    EXPECT_TRUE(c.PushGradients("t", ids, grads, step).ok());
  }
  std::vector<int64_t> probe(500);
  for (int i = 0; i < 500; ++i) probe[i] = i * 0x9E3779B97F4A7C15LL;
  std::vector<float> out(500 * 8);
  EXPECT_TRUE(c.Lookup("t", probe, absl::MakeSpan(out)).ok());
  all.insert(all.end(), out.begin(), out.end());
  return all;
}

TEST(CheckRestorable, NamesEachKeyOfARunSignatureThatDiffersWithBothValues) {
  RestoreOptions options;
  options.model = "m";
  options.expected_attachments["run"] = "dense=13 bottom_mlp=32,62 top_mlp=64,32 workers=1";
  const Attachments same = {{"run", "dense=13 bottom_mlp=32,62 top_mlp=64,32 workers=1"}};
  EXPECT_TRUE(CheckRestorable(7, same, options).ok());
  const Attachments other = {{"run", "dense=13 bottom_mlp=64,32 top_mlp=64,16 workers=1"}};
  const absl::Status s = CheckRestorable(7, other, options);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("bottom_mlp: the checkpoint's 64,32, this run's 32,62; "
                                   "top_mlp: the checkpoint's 64,16, this run's 64,32"));
  EXPECT_THAT(std::string(s.message()), ::testing::Not(::testing::HasSubstr("dense:")));
  // A key the checkpoint does not record (written before it was) is not compared; one it
  // records that this run lacks is.
  EXPECT_TRUE(CheckRestorable(7, {{"run", "dense=13 workers=1"}}, options).ok());
  EXPECT_THAT(std::string(CheckRestorable(7, {{"run", "dense=13 sparse=26"}}, options).message()),
              ::testing::HasSubstr("sparse: the checkpoint's 26, this run's (not set)"));
  // Values that are not signatures are compared whole.
  options.expected_attachments["run"] = "trainer_test";
  EXPECT_FALSE(CheckRestorable(7, {{"run", "trainer_test2"}}, options).ok());
}

// A collection in memory has no checkpoints: the one call that asks says why, as the
// trainer and the shard server pass it on.
TEST(InProcessCollection, HasNoCheckpointsAndSaysWhy) {
  auto c = Make(2);
  EXPECT_EQ(c->checkpointing(), nullptr);
  const absl::Status s = CheckpointsOf(*c).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("has no storage: checkpoints need a data directory"));
}

TEST(InProcessCollection, GivesBitIdenticalResultsWhateverTheShardCount) {
  std::vector<float> reference;
  for (int shards : {1, 2, 3, 8}) {
    auto c = Make(shards);
    ASSERT_TRUE(c->CreateTable(Config("t", 8)).ok());
    std::vector<float> got = Replay(*c);
    if (reference.empty()) {
      reference = got;
    } else {
      ASSERT_EQ(got, reference) << shards << " shards";
    }
  }
}

// A stream of batched lookups and pushes over five tables of different dims and
// optimizers; returns every lookup's output and the tables' final rows.
std::vector<float> ReplayBatches(EmbeddingCollection& c) {
  const int kTables = 5;
  for (int t = 0; t < kTables; ++t) {
    EXPECT_TRUE(c.CreateTable(Config(absl::StrCat("t", t), 4 + 4 * t,
                                     t % 2 == 0 ? v1::ADAGRAD : v1::ADAM))
                    .ok());
  }
  std::mt19937_64 rng(11);
  std::vector<float> all;
  std::vector<std::vector<int64_t>> ids(kTables);
  std::vector<std::vector<float>> outs(kTables), grads(kTables);
  // 5 x 512 ids a batch: enough for the collection to run its tables on the pool.
  const std::vector<int32_t> offsets = {0, 3, 3, 10, 40, 512};
  for (int step = 0; step < 15; ++step) {
    std::vector<TableBags> lookups(kTables);
    std::vector<TableGradients> pushes(kTables);
    for (int t = 0; t < kTables; ++t) {
      const int dim = 4 + 4 * t;
      ids[t].resize(512);
      for (auto& id : ids[t]) id = static_cast<int64_t>(rng() % (50 << t));
      outs[t].assign(5 * dim, 0.0f);
      lookups[t] = {absl::StrCat("t", t), ids[t], offsets, {}, v1::SUM, absl::MakeSpan(outs[t])};
      grads[t].resize(ids[t].size() * dim);
      for (auto& g : grads[t]) {
        g = static_cast<float>(static_cast<int64_t>(rng() % 2001) - 1000) / 999;
      }
      pushes[t] = {absl::StrCat("t", t), ids[t], grads[t]};
    }
    EXPECT_TRUE(c.LookupBatch(lookups, {}).ok());
    for (const auto& o : outs) all.insert(all.end(), o.begin(), o.end());
    EXPECT_TRUE(c.PushBatch(pushes, step).ok());
  }
  for (int t = 0; t < kTables; ++t) {
    std::vector<int64_t> probe(50 << t);
    for (size_t i = 0; i < probe.size(); ++i) probe[i] = static_cast<int64_t>(i);
    std::vector<float> out(probe.size() * (4 + 4 * t));
    LookupOptions read_only;
    read_only.insert_missing = false;
    EXPECT_TRUE(c.Lookup(absl::StrCat("t", t), probe, absl::MakeSpan(out), read_only).ok());
    all.insert(all.end(), out.begin(), out.end());
  }
  return all;
}

TEST(InProcessCollection, GivesBitIdenticalResultsWhateverTheThreadCount) {
  std::vector<float> reference;
  for (const int threads : {1, 2, 7}) {
    InProcessOptions options;
    options.num_shards = 3;
    options.threads = threads;
    auto c = NewInProcessCollection(options);
    ASSERT_TRUE(c.ok()) << c.status();
    std::vector<float> got = ReplayBatches(**c);
    if (reference.empty()) {
      reference = got;
    } else {
      ASSERT_EQ(got, reference) << threads << " threads";
    }
  }
  // A pool shared with the caller gives the same too.
  InProcessOptions shared;
  shared.num_shards = 3;
  shared.pool = std::make_shared<base::ThreadPool>(4);
  EXPECT_EQ(ReplayBatches(*NewInProcessCollection(shared).value()), reference);
  InProcessOptions bad;
  bad.threads = -2;
  EXPECT_EQ(NewInProcessCollection(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(InProcessCollection, ALookupsPlanServesItsPushAndGivesTheSameRows) {
  auto planned = Make(3);
  auto plain = Make(3);
  for (auto* c : {planned.get(), plain.get()}) ASSERT_TRUE(c->CreateTable(Config("t", 4)).ok());
  std::mt19937_64 rng(9);
  for (int step = 0; step < 10; ++step) {
    std::vector<int64_t> ids(60);
    for (auto& id : ids) id = static_cast<int64_t>(rng() % 40);
    const std::vector<int32_t> offsets = {0, 20, 45, 60};
    std::vector<float> a(3 * 4), b(3 * 4);
    IdPlan plan;
    TableBags with{"t", ids, offsets, {}, v1::SUM, absl::MakeSpan(a), &plan};
    TableBags without{"t", ids, offsets, {}, v1::SUM, absl::MakeSpan(b)};
    ASSERT_TRUE(planned->LookupBatch({&with, 1}, {}).ok());
    ASSERT_TRUE(plain->LookupBatch({&without, 1}, {}).ok());
    EXPECT_EQ(a, b);
    // The plan: distinct ids grouped by shard, and each id's place among them.
    ASSERT_TRUE(plan.valid);
    ASSERT_EQ(plan.inverse.size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(plan.unique_ids[plan.inverse[i]], ids[i]);
    ASSERT_EQ(plan.shard_begin.size(), 4u);
    for (int k = 0; k < 3; ++k) {
      for (int32_t u = plan.shard_begin[k]; u < plan.shard_begin[k + 1]; ++u) {
        EXPECT_EQ(ShardOf(plan.unique_ids[u], 1234, 3), k);
      }
    }
    // The planned push (gradients in the plan's order) against the summed one.
    std::vector<float> grads(ids.size() * 4), summed(plan.unique_ids.size() * 4, 0.0f);
    for (auto& g : grads) g = static_cast<float>(static_cast<int64_t>(rng() % 201) - 100) / 64;
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int d = 0; d < 4; ++d) summed[plan.inverse[i] * 4 + d] += grads[i * 4 + d];
    }
    const TableGradients push_planned{"t", plan.unique_ids, summed, &plan};
    const TableGradients push_plain{"t", ids, grads};
    ASSERT_TRUE(planned->PushBatch({&push_planned, 1}, step).ok());
    ASSERT_TRUE(plain->PushBatch({&push_plain, 1}, step).ok());
  }
  std::vector<int64_t> probe(40);
  for (int i = 0; i < 40; ++i) probe[i] = i;
  std::vector<float> x(40 * 4), y(40 * 4);
  ASSERT_TRUE(planned->Lookup("t", probe, absl::MakeSpan(x)).ok());
  ASSERT_TRUE(plain->Lookup("t", probe, absl::MakeSpan(y)).ok());
  EXPECT_EQ(x, y);
}

// A plan whose ids the caller changed after the lookup is not applied by its ranges: the
// changed id is routed to its own shard, as a push without a plan would route it.
TEST(InProcessCollection, APushWhosePlansIdsWereChangedIsRoutedAgain) {
  auto planned = Make(3);
  auto plain = Make(3);
  for (auto* c : {planned.get(), plain.get()}) ASSERT_TRUE(c->CreateTable(Config("t", 4)).ok());
  const std::vector<int64_t> ids = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> out(ids.size() * 4);
  IdPlan plan;
  TableBags bags{"t", ids, {}, {}, v1::SUM, absl::MakeSpan(out), &plan};
  ASSERT_TRUE(planned->LookupBatch({&bags, 1}, {}).ok());
  ASSERT_TRUE(plain->Lookup("t", ids, absl::MakeSpan(out)).ok());
  ASSERT_TRUE(plan.valid);
  // An id none of the lookup's, held by another shard than the one whose range it takes.
  int64_t moved = 100;
  while (ShardOf(moved, 1234, 3) == ShardOf(plan.unique_ids[0], 1234, 3)) ++moved;
  plan.unique_ids[0] = moved;
  std::vector<float> grads(plan.unique_ids.size() * 4);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.25f + 0.125f * static_cast<float>(i % 5);
  const TableGradients push_planned{"t", plan.unique_ids, grads, &plan};
  const TableGradients push_plain{"t", plan.unique_ids, grads};
  ASSERT_TRUE(planned->PushBatch({&push_planned, 1}, 1).ok());
  ASSERT_TRUE(plain->PushBatch({&push_plain, 1}, 1).ok());
  std::vector<float> x(plan.unique_ids.size() * 4), y(plan.unique_ids.size() * 4);
  ASSERT_TRUE(planned->Lookup("t", plan.unique_ids, absl::MakeSpan(x)).ok());
  ASSERT_TRUE(plain->Lookup("t", plan.unique_ids, absl::MakeSpan(y)).ok());
  EXPECT_EQ(x, y);
  EXPECT_EQ(planned->Usage("t")->rows, plain->Usage("t")->rows);
}

TEST(InProcessCollection, APlannedPushIsCheckedAndAStalePlanIsNotTrusted) {
  auto c = Make(2);
  ASSERT_TRUE(c->CreateTable(Config("t", 2)).ok());
  const std::vector<int64_t> ids = {5, 6, 5, 7};
  std::vector<float> out(ids.size() * 2);
  IdPlan plan;
  TableBags part{"t", ids, {}, {}, v1::SUM, absl::MakeSpan(out), &plan};
  ASSERT_TRUE(c->LookupBatch({&part, 1}, {}).ok());
  ASSERT_EQ(plan.unique_ids.size(), 3u);
  std::vector<float> before(3 * 2);
  ASSERT_TRUE(c->Lookup("t", plan.unique_ids, absl::MakeSpan(before)).ok());
  // A NaN is refused and nothing changes; so is a gradient buffer of the wrong size.
  std::vector<float> bad = {1, 1, std::nanf(""), 1, 1, 1};
  const TableGradients nan_push{"t", plan.unique_ids, bad, &plan};
  EXPECT_EQ(c->PushBatch({&nan_push, 1}, 1).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<float> short_grads = {1, 1};
  const TableGradients short_push{"t", plan.unique_ids, short_grads, &plan};
  EXPECT_EQ(c->PushBatch({&short_push, 1}, 1).code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> after(3 * 2);
  ASSERT_TRUE(c->Lookup("t", plan.unique_ids, absl::MakeSpan(after)).ok());
  EXPECT_EQ(after, before);
  // The table dropped and made again with another seed routes ids elsewhere: the plan is
  // not used, and the push lands where a plain one would.
  ASSERT_TRUE(c->DropTable("t").ok());
  v1::TableConfig reseeded = Config("t", 2);
  reseeded.set_seed(99);
  ASSERT_TRUE(c->CreateTable(reseeded).ok());
  auto reference = Make(2);
  ASSERT_TRUE(reference->CreateTable(reseeded).ok());
  const std::vector<float> grads = {1, 2, 3, 4, 5, 6};
  const TableGradients stale{"t", plan.unique_ids, grads, &plan};
  const TableGradients plain{"t", plan.unique_ids, grads};
  ASSERT_TRUE(c->PushBatch({&stale, 1}, 2).ok());
  ASSERT_TRUE(reference->PushBatch({&plain, 1}, 2).ok());
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(c->ShardsOf("t")->at(k)->num_rows(), reference->ShardsOf("t")->at(k)->num_rows());
  }
  std::vector<float> x(3 * 2), y(3 * 2);
  ASSERT_TRUE(c->Lookup("t", plan.unique_ids, absl::MakeSpan(x)).ok());
  ASSERT_TRUE(reference->Lookup("t", plan.unique_ids, absl::MakeSpan(y)).ok());
  EXPECT_EQ(x, y);
}

TEST(InProcessCollection, RefusesATablePlacedOnTheDevice) {
  auto c = NewInProcessCollection(2).value();
  v1::TableConfig config = Config("gpu_table", 8);
  config.set_placement(v1::DEVICE);
  const absl::Status s = c->CreateTable(config);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("placement DEVICE"));
  EXPECT_TRUE(c->ListTables()->empty());
  config.set_placement(static_cast<v1::Placement>(7));
  EXPECT_EQ(c->CreateTable(config).code(), absl::StatusCode::kInvalidArgument);
  config.set_placement(v1::HOST);
  EXPECT_TRUE(c->CreateTable(config).ok());
}

TEST(InProcessCollection, PlacesEachRowOnItsShardOfShardOf) {
  auto c = Make(4);
  ASSERT_TRUE(c->CreateTable(Config("t", 4)).ok());
  std::vector<int64_t> ids;
  for (int i = 0; i < 400; ++i) ids.push_back(i * 7777);
  std::vector<float> out(ids.size() * 4);
  ASSERT_TRUE(c->Lookup("t", ids, absl::MakeSpan(out)).ok());
  const auto* shards = c->ShardsOf("t");
  ASSERT_NE(shards, nullptr);
  int64_t total = 0;
  for (int k = 0; k < 4; ++k) {
    total += (*shards)[k]->num_rows();
    (*shards)[k]->ForEachRow([&](int64_t id, const float*, const float*, const RowMeta&) {
      EXPECT_EQ(ShardOf(id, 1234, 4), k);
    });
  }
  EXPECT_EQ(total, 400);
  auto usage = c->Usage("t");
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->rows, 400);
  EXPECT_GE(usage->memory_bytes, 400 * 4 * 4);
  EXPECT_EQ(c->Usage("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(InProcessCollection, LookupReturnsRowsInCallerOrderWithRepeats) {
  auto c = Make(3);
  ASSERT_TRUE(c->CreateTable(Config("t", 4)).ok());
  std::vector<int64_t> ids = {10, 20, 10, 30};
  std::vector<float> out(16);
  ASSERT_TRUE(c->Lookup("t", ids, absl::MakeSpan(out)).ok());
  auto ref = EmbeddingTable::Create(Config("t", 4));
  ASSERT_TRUE(ref.ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<float> w(4);
    (*ref)->InitialWeights(ids[i], w.data());
    EXPECT_EQ(std::vector<float>(out.begin() + i * 4, out.begin() + i * 4 + 4), w);
  }
}

TEST(InProcessCollection, PushSumsDuplicatesAcrossTheBatch) {
  auto c = Make(2);
  ASSERT_TRUE(c->CreateTable(Config("t", 2, v1::SGD)).ok());
  std::vector<int64_t> one = {42};
  std::vector<float> w0(2);
  ASSERT_TRUE(c->Lookup("t", one, absl::MakeSpan(w0)).ok());
  std::vector<int64_t> ids = {42, 7, 42};
  std::vector<float> g = {1, 2, 5, 5, 3, 4};
  ASSERT_TRUE(c->PushGradients("t", ids, g, 1).ok());
  std::vector<float> w1(2);
  ASSERT_TRUE(c->Lookup("t", one, absl::MakeSpan(w1)).ok());
  EXPECT_FLOAT_EQ(w1[0], w0[0] - 0.05f * 4);
  EXPECT_FLOAT_EQ(w1[1], w0[1] - 0.05f * 6);
}

// Found by the request fuzzer: finite gradients of a repeated id that sum to -Inf were
// refused by the one shard holding that id after the other shards had applied theirs.
TEST(InProcessCollection, GradientsThatSumToInfAreRefusedBeforeAnyShardApplies) {
  auto c = Make(4);
  const v1::TableConfig config = Config("user", 1);
  ASSERT_TRUE(c->CreateTable(config).ok());
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 64; ++i) ids.push_back(i);
  // An id of the last shard, so the others come first: twice, two gradients that overflow.
  int64_t bad = 0;
  while (ShardOf(bad, config.seed(), 4) != 3) ++bad;
  ASSERT_LT(bad, 64);
  ids.push_back(bad);
  std::vector<float> before(64), after(64);
  ASSERT_TRUE(
      c->Lookup("user", absl::MakeConstSpan(ids).subspan(0, 64), absl::MakeSpan(before)).ok());
  std::vector<float> g(ids.size(), 0.5f);
  g[bad] = -3e38f;
  g[64] = -3e38f;
  absl::Status s = c->PushGradients("user", ids, g, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("summed over repeated ids"));
  ASSERT_TRUE(
      c->Lookup("user", absl::MakeConstSpan(ids).subspan(0, 64), absl::MakeSpan(after)).ok());
  EXPECT_EQ(after, before);
}

TEST(InProcessCollection, BadInputGetsClearErrorsAndChangesNothing) {
  auto c = Make(2);
  ASSERT_TRUE(c->CreateTable(Config("user", 4)).ok());
  EXPECT_EQ(c->CreateTable(Config("user", 4)).code(), absl::StatusCode::kAlreadyExists);
  std::vector<int64_t> ids = {1, 2};
  std::vector<float> out(8);
  ASSERT_TRUE(c->Lookup("user", ids, absl::MakeSpan(out)).ok());
  const std::vector<float> before = out;

  auto msg = [](absl::Status s) { return std::string(s.message()); };
  absl::Status s = c->Lookup("item", ids, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(msg(s), ::testing::HasSubstr("table 'item' not found"));

  std::vector<float> small(6);
  s = c->Lookup("user", ids, absl::MakeSpan(small));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(msg(s), ::testing::HasSubstr("dimension mismatch"));

  std::vector<float> g = {1, 1, 1, 1, 1, 1};  // 2 ids x dim 3: wrong dimension
  s = c->PushGradients("user", ids, g, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(msg(s), ::testing::HasSubstr("expected 8"));

  std::vector<float> nan = {0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, NAN, 0.1f};
  s = c->PushGradients("user", ids, nan, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(msg(s), ::testing::HasSubstr("gradient for id 2"));

  std::vector<int32_t> bad_offsets = {0, 2, 1};
  std::vector<float> pooled(8);
  s = c->PooledLookup("user", ids, bad_offsets, {}, v1::SUM, absl::MakeSpan(pooled));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(msg(s), ::testing::HasSubstr("not monotone"));
  std::vector<int32_t> past = {0, 3};
  s = c->PooledLookup("user", ids, past, {}, v1::SUM, absl::MakeSpan(pooled).first(4));
  EXPECT_THAT(msg(s), ::testing::HasSubstr("out of range"));
  std::vector<int32_t> good = {0, 2};
  std::vector<float> bad_weights = {1.0f};
  s = c->PooledLookup("user", ids, good, bad_weights, v1::SUM, absl::MakeSpan(pooled).first(4));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(c->Lookup("user", ids, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, before) << "rejected requests must not change rows";
}

// Two shards holding table "small" (dim 4) with a budget of `max_rows` rows.
std::unique_ptr<InProcessCollection> WithBudget(int64_t max_rows) {
  auto c = Make(2);
  v1::TableConfig cfg = Config("small", 4);
  cfg.set_max_rows(max_rows);
  EXPECT_TRUE(c->CreateTable(cfg).ok());
  return c;
}

// Ids 0 .. n-1.
std::vector<int64_t> FirstIds(int n) {
  std::vector<int64_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = i;
  return ids;
}

TEST(InProcessCollection, SplitsRowBudgetOverShards) {
  auto c = WithBudget(10);
  const std::vector<int64_t> ids = FirstIds(100);
  std::vector<float> out(ids.size() * 4);
  absl::Status s = c->Lookup("small", ids, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("row budget of 5 rows"));
}

TEST(InProcessCollection, APushOverOneShardsBudgetChangesNoShard) {
  auto c = WithBudget(32);
  const std::vector<int64_t> ids = FirstIds(40);
  std::vector<float> before(ids.size() * 4), after(ids.size() * 4);
  LookupOptions read_only;
  read_only.insert_missing = false;
  ASSERT_TRUE(c->Lookup("small", ids, absl::MakeSpan(before), read_only).ok());
  std::vector<float> g(ids.size() * 4, 0.01f);
  absl::Status s = c->PushGradients("small", ids, g, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  ASSERT_TRUE(c->Lookup("small", ids, absl::MakeSpan(after), read_only).ok());
  EXPECT_EQ(after, before) << "a refused push must not change rows";
}

TEST(InProcessCollection, ListsTablesSortedByName) {
  auto c = Make(1);
  ASSERT_TRUE(c->CreateTable(Config("b", 4)).ok());
  ASSERT_TRUE(c->CreateTable(Config("a", 8)).ok());
  auto list = c->ListTables();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].name(), "a");
  EXPECT_EQ((*list)[0].dim(), 8);
  EXPECT_EQ((*list)[1].name(), "b");
  EXPECT_FALSE(NewInProcessCollection(0).ok());
}

}  // namespace
}  // namespace tessera::embedding

namespace tessera::embedding {
namespace {

// A collection of 2 shards that is shard `index` of `count` of a cluster.
std::unique_ptr<InProcessCollection> PlacedCollection(int index, int count) {
  InProcessOptions o;
  o.num_shards = 2;
  o.cluster_shard_index = index;
  o.cluster_num_shards = count;
  return NewInProcessCollection(o).value();
}

// A cluster shard's collection moving to another place (a live reshard): the rows it no
// longer owns go, the others stay as they were.
TEST(InProcessCollection, RepartitionKeepsOnlyTheRowsOfItsNewPlace) {
  auto c = PlacedCollection(0, 2);
  v1::TableConfig config;
  config.set_name("t");
  config.set_dim(4);
  config.set_seed(21);
  config.mutable_optimizer()->set_type(v1::ADAGRAD);
  config.mutable_optimizer()->set_learning_rate(0.1f);
  ASSERT_TRUE(c->CreateTable(config).ok());
  std::vector<int64_t> mine;
  for (int64_t id = 0; mine.size() < 3000; ++id) {
    if (ShardOfRow(config, id * 977, 2) == 0) mine.push_back(id * 977);
  }
  std::vector<float> g(mine.size() * 4, 0.5f);
  ASSERT_TRUE(c->PushGradients("t", mine, g, 3).ok());
  std::vector<float> before(mine.size() * 4);
  ASSERT_TRUE(c->Lookup("t", mine, absl::MakeSpan(before)).ok());

  ASSERT_TRUE(c->Repartition(0, 3).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(c->Repartition(3, 3)));
  int64_t kept = 0;
  ASSERT_TRUE(c->ExportRows("t", {}, [&](const RowBlock& b) {
                  for (int64_t id : b.ids) {
                    EXPECT_EQ(ShardOfRow(config, id, 3), 0) << id;
                    ++kept;
                  }
                  return absl::OkStatus();
                }).ok());
  int64_t staying = 0;
  for (int64_t id : mine) staying += ShardOfRow(config, id, 3) == 0;
  EXPECT_EQ(kept, staying);
  EXPECT_GT(staying, 1500);  // jump hash: about 2/3 stay
  EXPECT_LT(staying, static_cast<int64_t>(mine.size()));
  EXPECT_EQ(c->Usage("t").value().rows, staying);
  // The rows that stayed are as they were.
  std::vector<float> after(mine.size() * 4);
  LookupOptions read_only;
  read_only.insert_missing = false;
  ASSERT_TRUE(c->Lookup("t", mine, absl::MakeSpan(after), read_only).ok());
  for (size_t i = 0; i < mine.size(); ++i) {
    if (ShardOfRow(config, mine[i], 3) != 0) continue;
    for (int d = 0; d < 4; ++d) EXPECT_EQ(after[i * 4 + d], before[i * 4 + d]);
  }
}

using testing::RowsOf;
using testing::StoredRows;

// A reshard given up after its imports (DropMovingRows) leaves no row of a dynamic table
// on a shard that does not own it: the rows that came for the next place go, the rows the
// current place owns stay as they were.
TEST(InProcessCollection, AGivenUpReshardLeavesNoRowItDoesNotOwn) {
  auto c = PlacedCollection(1, 3);
  v1::TableConfig config;
  config.set_name("d");
  config.set_dim(4);
  config.mutable_optimizer()->set_type(v1::ADAGRAD);
  ASSERT_TRUE(c->CreateTable(config).ok());
  std::vector<int64_t> own;
  RowBlock moving;  // a 3-to-2 reshard's for shard 1 of 2: ids shard 2 of 3 owns now
  moving.dim = 4;
  moving.state_floats = 4;
  for (int64_t id = 0; id < 600; ++id) {
    if (ShardOfRow(config, id, 3) == 1) own.push_back(id);
    if (ShardOfRow(config, id, 3) == 2 && ShardOfRow(config, id, 2) == 1) {
      const std::vector<float> w(4, 0.5f * static_cast<float>(id)), st(4, 1.0f);
      moving.Append(id, w.data(), st.data(), 1, 1);
    }
  }
  ASSERT_GT(moving.ids.size(), 50u);
  ASSERT_TRUE(c->PushGradients("d", own, std::vector<float>(own.size() * 4, 0.5f), 1).ok());
  const testing::RowMap before = testing::StoredRows(*c, "d");
  ASSERT_TRUE(c->ImportMovingRows("d", moving, 1, 2).ok());
  ASSERT_EQ(testing::StoredRows(*c, "d").size(), before.size() + moving.ids.size());
  ASSERT_TRUE(c->DropMovingRows().ok());
  EXPECT_TRUE(testing::StoredRows(*c, "d") == before);
  EXPECT_EQ(c->Usage("d").value().rows, static_cast<int64_t>(before.size()));
}

// A fixed vocabulary's arrays are laid out for one place: a live reshard fills a layout
// for the next place with moving rows (ImportMovingRows) while the old one serves, and
// SwitchPlace adopts it. Rows moved there before an abort (DropMovingRows) do not come
// back; the old layout's rows go with the switch.
TEST(InProcessCollection, AFixedVocabularySwitchesToTheLayoutItsMovingRowsFilled) {
  auto c = PlacedCollection(0, 2);
  v1::TableConfig fixed;
  fixed.set_name("f");
  fixed.set_dim(4);
  fixed.set_seed(5);
  fixed.set_vocabulary_size(1000);
  fixed.mutable_optimizer()->set_type(v1::ADAGRAD);
  fixed.mutable_optimizer()->set_learning_rate(0.1f);
  ASSERT_TRUE(c->CreateTable(fixed).ok());
  std::vector<int64_t> even;
  for (int64_t id = 0; id < 600; id += 2) even.push_back(id);
  ASSERT_TRUE(c->PushGradients("f", even, std::vector<float>(even.size() * 4, 0.5f), 1).ok());
  const testing::RowMap before = StoredRows(*c, "f");
  ASSERT_EQ(before.size(), even.size());

  // Moving rows for shard 0 of 3: those it keeps (ids 0 mod 6) and others' (3 mod 6).
  RowBlock moving;
  moving.dim = 4;
  moving.state_floats = 4;
  for (int64_t id = 0; id < 600; id += 3) {
    std::vector<float> w(4, 0.25f * static_cast<float>(id)), st(4, 1.0f);
    if (id % 2 == 0) {
      const std::vector<float>& row = before.at(id);
      w.assign(row.begin(), row.begin() + 4);
      st.assign(row.begin() + 4, row.end());
    }
    moving.Append(id, w.data(), st.data(), 1, 1);
  }
  RowBlock given_up;  // an aborted reshard's: dropped, never served
  given_up.dim = 4;
  given_up.state_floats = 4;
  for (int64_t id = 603; id < 900; id += 3) {
    const std::vector<float> w(4, 0.25f * static_cast<float>(id)), st(4, 1.0f);
    given_up.Append(id, w.data(), st.data(), 1, 1);
  }
  ASSERT_TRUE(c->ImportMovingRows("f", given_up, 0, 3).ok());
  ASSERT_TRUE(c->DropMovingRows().ok());
  ASSERT_TRUE(c->ImportMovingRows("f", moving, 0, 3).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(c->ImportMovingRows("f", moving, 3, 3)));

  // The old place serves on, and takes pushes.
  EXPECT_TRUE(StoredRows(*c, "f") == before);
  std::vector<float> out(4);
  EXPECT_TRUE(absl::IsInvalidArgument(c->Lookup("f", {3}, absl::MakeSpan(out))));

  ASSERT_TRUE(c->SwitchPlace(0, 3).ok());
  const testing::RowMap want = RowsOf(moving);
  EXPECT_TRUE(StoredRows(*c, "f") == want);
  EXPECT_EQ(c->Usage("f").value().rows, static_cast<int64_t>(want.size()));
  ASSERT_TRUE(c->Lookup("f", {3}, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out[0], 0.75f);
  EXPECT_TRUE(absl::IsInvalidArgument(c->Lookup("f", {2}, absl::MakeSpan(out))));
  // A row of the given-up import reads its initial weights (never stored here).
  ASSERT_TRUE(c->Lookup("f", {603}, absl::MakeSpan(out)).ok());
  EXPECT_NE(out[0], 0.25f * 601);
  EXPECT_EQ(c->Usage("f").value().rows, static_cast<int64_t>(want.size()));
  // Pushes go to the new layout; Repartition to the same place keeps it.
  ASSERT_TRUE(c->PushGradients("f", {3, 9}, std::vector<float>(8, 1.0f), 2).ok());
  ASSERT_TRUE(c->Repartition(0, 3).ok());
  EXPECT_EQ(StoredRows(*c, "f").size(), want.size());
  EXPECT_NE(StoredRows(*c, "f").at(3), want.at(3));
  EXPECT_TRUE(absl::IsInvalidArgument(c->SwitchPlace(3, 3)));
}

}  // namespace
}  // namespace tessera::embedding
