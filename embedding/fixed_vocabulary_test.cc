// Fixed-vocabulary tables (TableConfig.vocabulary_size): rows addressed by id.

#include <atomic>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "embedding/collection.h"
#include "embedding/embedding_table.h"
#include "embedding/inprocess_collection.h"
#include "gtest/gtest.h"
#include "tests/support/table_configs.h"

namespace tessera::embedding {
namespace {

constexpr int64_t kVocabulary = 10000;

v1::TableConfig Config(int dim, v1::OptimizerType opt = v1::ADAGRAD, v1::Dtype dtype = v1::FP32,
                       int64_t vocabulary = kVocabulary) {
  v1::TableConfig c = testing::TestTable("item", dim, 11, opt, 0.05f);
  c.set_dtype(dtype);
  c.set_vocabulary_size(vocabulary);
  return c;
}

std::unique_ptr<EmbeddingTable> Make(const v1::TableConfig& c, VocabularyPart part = {}) {
  auto t = EmbeddingTable::Create(c, 0, part);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(t).value();
}

// `n` distinct ids in [0, kVocabulary), drawn with `seed`.
std::vector<int64_t> Ids(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::set<int64_t> s;
  while (static_cast<int>(s.size()) < n) s.insert(rng() % kVocabulary);
  std::vector<int64_t> ids(s.begin(), s.end());
  std::shuffle(ids.begin(), ids.end(), rng);
  return ids;
}

std::vector<float> Grads(size_t n, int dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 0.1f);
  std::vector<float> out(n * dim);
  for (auto& v : out) v = g(rng);
  return out;
}

// Untouched rows read their initial weights, the same as a dynamic table's, and nothing
// is stored by a lookup.
TEST(FixedVocabulary, UntouchedRowsReadTheirInitialWeights) {
  auto fixed = Make(Config(8));
  v1::TableConfig dynamic_config = Config(8);
  dynamic_config.clear_vocabulary_size();
  auto dynamic = Make(dynamic_config);
  const std::vector<int64_t> ids = {0, 1, 9999, 4242, 4242};
  std::vector<float> a(ids.size() * 8), b(ids.size() * 8);
  ASSERT_TRUE(fixed->Lookup(ids, a.data()).ok());
  ASSERT_TRUE(dynamic->Lookup(ids, b.data(), /*insert_missing=*/false).ok());
  EXPECT_EQ(a, b);
  EXPECT_EQ(fixed->num_rows(), 0);
  EXPECT_TRUE(fixed->fixed_vocabulary());
  EXPECT_GE(fixed->MemoryBytes(), kVocabulary * (8 + 8) * 4);  // weights and accumulators
}

// Every optimizer and dtype: a fixed-vocabulary table's rows equal a dynamic table's
// after the same pushes, bit for bit (update counts for Adam and half-precision rounding
// included), and export the same rows.
TEST(FixedVocabulary, UpdatesMatchADynamicTableBitForBit) {
  for (const v1::OptimizerType opt :
       {v1::SGD, v1::ADAGRAD, v1::ROWWISE_ADAGRAD, v1::ADAM, v1::FTRL}) {
    for (const v1::Dtype dtype : {v1::FP32, v1::BF16}) {
      SCOPED_TRACE(::testing::Message()
                   << v1::OptimizerType_Name(opt) << " " << v1::Dtype_Name(dtype));
      const int dim = 16;
      auto fixed = Make(Config(dim, opt, dtype));
      v1::TableConfig dc = Config(dim, opt, dtype);
      dc.clear_vocabulary_size();
      auto dynamic = Make(dc);
      for (int step = 1; step <= 6; ++step) {
        const std::vector<int64_t> ids = Ids(700, step % 3);  // rows seen again
        const std::vector<float> g = Grads(ids.size(), dim, step);
        ASSERT_TRUE(fixed->ApplyUniqueGradients(ids, g.data(), step).ok());
        ASSERT_TRUE(dynamic->ApplyUniqueGradients(ids, g.data(), step).ok());
      }
      const std::vector<int64_t> all = Ids(3000, 7);
      std::vector<float> a(all.size() * dim), b(all.size() * dim);
      ASSERT_TRUE(fixed->Lookup(all, a.data()).ok());
      ASSERT_TRUE(dynamic->Lookup(all, b.data(), false).ok());
      ASSERT_EQ(a, b);
      EXPECT_EQ(fixed->num_rows(), dynamic->num_rows());
      int64_t rows = 0;
      fixed->ForEachRow([&](int64_t id, const float* w, const float* state, const RowMeta& meta) {
        ++rows;
        auto want = dynamic->ReadRow(id);
        ASSERT_TRUE(want.ok()) << id;
        ASSERT_EQ(std::vector<float>(w, w + dim), want->weights) << id;
        ASSERT_EQ(std::vector<float>(state, state + want->state.size()), want->state) << id;
        if (opt == v1::ADAM || dtype != v1::FP32) {
          EXPECT_EQ(meta.update_count, want->meta.update_count) << id;
        }
      });
      EXPECT_EQ(rows, dynamic->num_rows());
    }
  }
}

TEST(FixedVocabulary, IdsOutsideTheVocabularyAreRefusedAndChangeNothing) {
  auto t = Make(Config(4, v1::SGD));
  std::vector<float> out(8), g(8, 1.0f);
  for (const int64_t bad : {int64_t{-1}, kVocabulary, int64_t{1} << 50}) {
    const std::vector<int64_t> ids = {3, bad};
    absl::Status s = t->Lookup(ids, out.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("outside its vocabulary [0, 10000)"), std::string::npos) << s;
    EXPECT_EQ(t->ApplyUniqueGradients(ids, g.data(), 1).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(t->PushGradients(ids, g.data(), 1).code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(t->num_rows(), 0);  // id 3 was not updated either
  // A part of the vocabulary holds its own ids only.
  auto part = Make(Config(4, v1::SGD), VocabularyPart{1, 3});
  EXPECT_TRUE(part->ApplyUniqueGradients(std::vector<int64_t>{4, 7}, g.data(), 1).ok());
  absl::Status other = part->ApplyUniqueGradients(std::vector<int64_t>{5}, g.data(), 1);
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(other.message().find("not held here"), std::string::npos) << other;
}

// Dirty rows, PutRow, Forget and ReadRow keep a dynamic table's contract.
TEST(FixedVocabulary, DirtyRowsPutRowAndForget) {
  auto t = Make(Config(4, v1::ADAM));
  const std::vector<int64_t> ids = {5, 77, 9000};
  const std::vector<float> g = Grads(3, 4, 1);
  ASSERT_TRUE(t->ApplyUniqueGradients(ids, g.data(), 1).ok());
  EXPECT_EQ(t->DirtyRows(), 3);
  std::set<int64_t> dirty;
  t->ForEachDirtyRow([&](int64_t id, const float*, const float*, const RowMeta& m) {
    dirty.insert(id);
    EXPECT_EQ(m.update_count, 1);
  });
  EXPECT_EQ(dirty, std::set<int64_t>(ids.begin(), ids.end()));
  t->ClearDirty();
  EXPECT_EQ(t->DirtyRows(), 0);
  t->ForEachDirtyRow([&](int64_t id, const float*, const float*, const RowMeta&) {
    ADD_FAILURE() << "dirty row " << id << " after ClearDirty";
  });
  // PutRow stores exactly (an import marks it dirty); Forget makes it initial again.
  const std::vector<float> w = {1, 2, 3, 4}, state(t->optimizer().StateFloats(), 0.5f);
  RowMeta meta;
  meta.update_count = 9;
  ASSERT_TRUE(t->PutRow(123, w, state, meta, /*mark_dirty=*/true).ok());
  auto row = t->ReadRow(123);
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->weights, w);
  EXPECT_EQ(row->state, state);
  EXPECT_EQ(row->meta.update_count, 9);
  EXPECT_EQ(t->DirtyRows(), 1);
  EXPECT_EQ(t->num_rows(), 4);
  t->Forget(123);
  EXPECT_EQ(t->ReadRow(123).status().code(), absl::StatusCode::kNotFound);
  std::vector<float> got(4), initial(4);
  ASSERT_TRUE(t->Lookup(std::vector<int64_t>{123}, got.data()).ok());
  t->InitialWeights(123, initial.data());
  EXPECT_EQ(got, initial);
  EXPECT_EQ(t->num_rows(), 3);
  EXPECT_EQ(t->DirtyRows(), 0);
  EXPECT_EQ(t->PutRow(kVocabulary, w, state, meta).code(), absl::StatusCode::kInvalidArgument);
}

// A long lookup (many chunks of the copy loop) mixes rows stored with values, rows stored
// as zeros (which read as zeros, not as initial weights) and rows never stored (initial
// weights), alone and while a writer updates other rows of the table; fp32 and bf16,
// the whole vocabulary and a part of it.
TEST(FixedVocabulary, LongLookupsTellStoredZeroRowsFromUntouchedOnes) {
  for (const v1::Dtype dtype : {v1::FP32, v1::BF16}) {
    for (const VocabularyPart part : {VocabularyPart{0, 1}, VocabularyPart{2, 3}}) {
      SCOPED_TRACE(::testing::Message() << v1::Dtype_Name(dtype) << " part " << part.index);
      constexpr int kDim = 8;
      auto t = Make(Config(kDim, v1::SGD, dtype), part);
      std::vector<int64_t> mine, theirs;  // ids the lookups read, ids the writer updates
      for (int64_t id = part.index; id < kVocabulary; id += part.count) {
        (id % 7 == 3 ? theirs : mine).push_back(id);
      }
      std::map<int64_t, std::vector<float>> want;
      const std::vector<float> zeros(kDim, 0.0f), ones(kDim, 1.0f);
      for (size_t k = 0; k < mine.size(); ++k) {
        const int64_t id = mine[k];
        std::vector<float> w(kDim);
        if (k % 5 == 0) {
          ASSERT_TRUE(t->PutRow(id, zeros, {}, RowMeta{}).ok());
          w = zeros;
        } else if (k % 5 == 1) {
          ASSERT_TRUE(t->PutRow(id, ones, {}, RowMeta{}).ok());
          w = ones;
        } else {
          t->InitialWeights(id, w.data());
        }
        want[id] = w;
      }
      auto check = [&] {
        std::vector<float> out(mine.size() * kDim);
        ASSERT_TRUE(t->Lookup(mine, out.data()).ok());
        for (size_t k = 0; k < mine.size(); ++k) {
          ASSERT_EQ(std::vector<float>(out.begin() + k * kDim, out.begin() + (k + 1) * kDim),
                    want[mine[k]])
              << "id " << mine[k];
        }
      };
      check();
      std::atomic<bool> done{false};
      std::thread writer([&] {
        const std::vector<float> g(theirs.size() * kDim, 0.01f);
        for (int s = 1; s <= 400 && !done.load(); ++s) {
          ASSERT_TRUE(t->ApplyUniqueGradients(theirs, g.data(), s).ok());
        }
      });
      for (int r = 0; r < 20; ++r) check();
      done = true;
      writer.join();
    }
  }
}

// Lookups during updates see whole rows: SGD with gradient 1 moves every weight of a
// row by the same step, so a torn read would show two different offsets.
TEST(FixedVocabulary, ConcurrentLookupsSeeWholeRowsAndNoUpdateIsLost) {
  v1::TableConfig c = Config(16, v1::SGD);
  c.mutable_initializer()->set_type(v1::ZEROS);
  auto t = Make(c);
  const std::vector<int64_t> ids = Ids(512, 3);
  const std::vector<float> g(ids.size() * 16, 1.0f);
  constexpr int kSteps = 200;
  std::atomic<bool> done{false};
  std::thread reader([&] {
    std::vector<float> out(ids.size() * 16);
    for (int r = 0; r < 2000 && !done.load(); ++r) {
      ASSERT_TRUE(t->Lookup(ids, out.data()).ok());
      for (size_t i = 0; i < ids.size(); ++i) {
        for (int j = 1; j < 16; ++j) ASSERT_EQ(out[i * 16 + j], out[i * 16]) << ids[i];
      }
    }
  });
  std::vector<std::thread> writers;
  for (int w = 0; w < 2; ++w) {
    writers.emplace_back([&] {
      for (int s = 0; s < kSteps; ++s) ASSERT_TRUE(t->ApplyUniqueGradients(ids, g.data(), s).ok());
    });
  }
  for (auto& w : writers) w.join();
  done = true;
  reader.join();
  std::vector<float> out(ids.size() * 16);
  ASSERT_TRUE(t->Lookup(ids, out.data()).ok());
  for (float v : out) ASSERT_NEAR(v, -0.05f * 2 * kSteps, 1e-3f);
}

// In a collection, each shard holds every num_shards-th id densely; results equal one
// shard's, and a batch with an id outside the vocabulary changes no shard.
TEST(FixedVocabulary, ShardedCollectionsHoldEveryNthIdAndAgree) {
  auto one = NewInProcessCollection(1).value();
  auto three = NewInProcessCollection(3).value();
  const v1::TableConfig c = Config(8, v1::ADAGRAD);
  ASSERT_TRUE(one->CreateTable(c).ok());
  ASSERT_TRUE(three->CreateTable(c).ok());
  for (int step = 1; step <= 4; ++step) {
    std::vector<int64_t> ids = Ids(900, step);
    ids.push_back(ids[0]);  // a repeat, summed
    const std::vector<float> g = Grads(ids.size(), 8, 40 + step);
    ASSERT_TRUE(one->PushGradients("item", ids, g, step).ok());
    ASSERT_TRUE(three->PushGradients("item", ids, g, step).ok());
  }
  const std::vector<int64_t> all = Ids(5000, 9);
  std::vector<float> a(all.size() * 8), b(all.size() * 8);
  ASSERT_TRUE(one->Lookup("item", all, absl::MakeSpan(a)).ok());
  ASSERT_TRUE(three->Lookup("item", all, absl::MakeSpan(b)).ok());
  EXPECT_EQ(a, b);
  const auto& shards = *three->ShardsOf("item");
  int64_t rows = 0;
  for (int k = 0; k < 3; ++k) {
    shards[k]->ForEachRow(
        [&](int64_t id, const float*, const float*, const RowMeta&) { EXPECT_EQ(id % 3, k); });
    rows += shards[k]->num_rows();
  }
  EXPECT_EQ(rows, (*one->ShardsOf("item"))[0]->num_rows());
  const std::vector<int64_t> bad = {1, 2, 3, kVocabulary + 1};
  const std::vector<float> g = Grads(bad.size(), 8, 1);
  EXPECT_EQ(three->PushGradients("item", bad, g, 9).code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> after(all.size() * 8);
  ASSERT_TRUE(three->Lookup("item", all, absl::MakeSpan(after)).ok());
  EXPECT_EQ(after, b);
}

// A shard server's collection (shard 1 of 2) splits its ids (the odd ones) over its own
// in-process shards densely.
TEST(FixedVocabulary, AClusterShardsCollectionHoldsItsIdsOnly) {
  InProcessOptions o;
  o.num_shards = 2;
  o.cluster_shard_index = 1;
  o.cluster_num_shards = 2;
  auto c = NewInProcessCollection(o).value();
  ASSERT_TRUE(c->CreateTable(Config(4, v1::SGD)).ok());
  const std::vector<int64_t> odd = {1, 3, 5, 7, 9999};
  ASSERT_TRUE(c->PushGradients("item", odd, Grads(odd.size(), 4, 2), 1).ok());
  const auto& shards = *c->ShardsOf("item");
  EXPECT_EQ(shards[0]->num_rows() + shards[1]->num_rows(), 5);
  EXPECT_EQ(shards[0]->num_rows(), 2);  // 1 and 5: id / 2 even
  const std::vector<int64_t> even = {2};
  EXPECT_EQ(c->PushGradients("item", even, Grads(1, 4, 2), 2).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FixedVocabulary, AVocabularyPastTheMemoryBudgetIsRefusedAtCreation) {
  InProcessOptions o;
  o.memory_limit = 64 << 20;
  auto c = NewInProcessCollection(o).value();
  absl::Status s = c->CreateTable(Config(64, v1::ADAM, v1::FP32, 1'000'000));  // ~770 MB
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("vocabulary of 1000000 rows"), std::string::npos) << s;
  EXPECT_TRUE(c->CreateTable(Config(64, v1::ADAM, v1::FP32, 50'000)).ok());  // ~39 MB
}

TEST(FixedVocabulary, AdmissionAppliesToFixedRows) {
  v1::TableConfig c = Config(4, v1::SGD);
  c.mutable_admission()->set_min_count(2);
  auto t = Make(c);
  const std::vector<int64_t> ids = Ids(300, 5);
  const std::vector<float> g(ids.size() * 4, 1.0f);
  ASSERT_TRUE(t->ApplyUniqueGradients(ids, g.data(), 1).ok());
  EXPECT_EQ(t->num_rows(), 0);
  EXPECT_EQ(t->refused_ids(), 300);
  ASSERT_TRUE(t->ApplyUniqueGradients(ids, g.data(), 2).ok());
  EXPECT_EQ(t->num_rows(), 300);
}

TEST(FixedVocabulary, ConfigIsValidated) {
  v1::TableConfig c = Config(4);
  c.set_vocabulary_size(-1);
  EXPECT_EQ(EmbeddingTable::Create(c).status().code(), absl::StatusCode::kInvalidArgument);
  c = Config(4);
  c.set_max_rows(100);
  EXPECT_EQ(EmbeddingTable::Create(c).status().code(), absl::StatusCode::kInvalidArgument);
  c = Config(4);
  c.mutable_eviction()->set_ttl_steps(5);
  absl::Status s = EmbeddingTable::Create(c).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no max_rows, eviction or ttl_steps"), std::string::npos) << s;
}

}  // namespace
}  // namespace tessera::embedding
