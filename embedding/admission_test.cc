// Feature admission (TableConfig.admission): which ids get a row, and what the others see.

#include <map>
#include <set>
#include <vector>

#include "embedding/embedding_table.h"
#include "embedding/inprocess_collection.h"
#include "gtest/gtest.h"
#include "tests/support/table_configs.h"

namespace tessera::embedding {
namespace {

constexpr int kDim = 4;

v1::TableConfig Config(int min_count, float probability = 0.0f, uint64_t seed = 7) {
  v1::TableConfig c = testing::TestTable("ads", kDim, seed, v1::SGD, 0.5f);
  c.mutable_admission()->set_min_count(min_count);
  c.mutable_admission()->set_probability(probability);
  return c;
}

std::unique_ptr<EmbeddingTable> Make(const v1::TableConfig& c, int64_t budget = 0) {
  auto t = EmbeddingTable::Create(c, budget);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(t).value();
}

std::vector<int64_t> Range(int64_t from, int64_t n) {
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = from + i * 7919;
  return ids;
}

absl::Status PushOnes(EmbeddingTable& t, const std::vector<int64_t>& ids, int64_t step) {
  const std::vector<float> g(ids.size() * kDim, 1.0f);
  return t.ApplyUniqueGradients(ids, g.data(), step);
}

std::set<int64_t> StoredIds(const EmbeddingTable& t) {
  std::set<int64_t> out;
  t.ForEachRow([&](int64_t id, const float*, const float*, const RowMeta&) { out.insert(id); });
  return out;
}

// An id gets its row at the push of its min_count-th step, from its initial weights with
// that step's gradient applied; before that lookups read the initial weights, nothing is
// stored and gradients are dropped.
TEST(Admission, AnIdGetsARowAtItsMinCountthPush) {
  auto t = Make(Config(3));
  const std::vector<int64_t> ids = Range(11, 500);
  std::vector<float> initial(ids.size() * kDim), seen(ids.size() * kDim);
  for (size_t i = 0; i < ids.size(); ++i) t->InitialWeights(ids[i], initial.data() + i * kDim);
  for (int step = 1; step <= 2; ++step) {
    ASSERT_TRUE(t->Lookup(ids, seen.data()).ok());
    EXPECT_EQ(seen, initial);
    ASSERT_TRUE(PushOnes(*t, ids, step).ok());
    EXPECT_EQ(t->num_rows(), 0) << "step " << step;
  }
  EXPECT_EQ(t->refused_ids(), 1000);
  ASSERT_TRUE(t->Lookup(ids, seen.data()).ok());
  EXPECT_EQ(seen, initial);
  EXPECT_EQ(t->MissingRows(ids), 500);  // the next push admits them all
  ASSERT_TRUE(PushOnes(*t, ids, 3).ok());
  EXPECT_EQ(t->num_rows(), 500);
  ASSERT_TRUE(t->Lookup(ids, seen.data()).ok());
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_FLOAT_EQ(seen[i], initial[i] - 0.5f) << i;
  // Admitted rows take every later push.
  ASSERT_TRUE(PushOnes(*t, ids, 4).ok());
  ASSERT_TRUE(t->Lookup(ids, seen.data()).ok());
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_FLOAT_EQ(seen[i], initial[i] - 1.0f) << i;
  EXPECT_EQ(t->refused_ids(), 1000);
}

// Counts are per id: ids pushed less often stay out while frequent ones get in.
TEST(Admission, OnlyIdsSeenOftenEnoughGetRows) {
  auto t = Make(Config(4));
  const std::vector<int64_t> frequent = Range(1, 300), rare = Range(5'000'001, 300);
  for (int step = 1; step <= 6; ++step) {
    ASSERT_TRUE(PushOnes(*t, frequent, step).ok());
    if (step % 2 == 0) {
      ASSERT_TRUE(PushOnes(*t, rare, step).ok());  // 3 pushes
    }
  }
  EXPECT_EQ(StoredIds(*t), std::set<int64_t>(frequent.begin(), frequent.end()));
  // The sketch never counts low: one more push admits every rare id.
  ASSERT_TRUE(PushOnes(*t, rare, 7).ok());
  EXPECT_EQ(t->num_rows(), 600);
}

// A sketch far smaller than the ids it counts over-counts: ids get in early, never late.
TEST(Admission, ATinySketchAdmitsEarlyNeverLate) {
  v1::TableConfig c = Config(5);
  c.mutable_admission()->set_sketch_width(64);  // one counter per stripe and sketch row
  auto t = Make(c);
  const std::vector<int64_t> ids = Range(3, 4000);
  ASSERT_TRUE(PushOnes(*t, ids, 1).ok());
  ASSERT_TRUE(PushOnes(*t, ids, 2).ok());
  EXPECT_EQ(t->num_rows(), 4000);  // each counter saw ~60 ids
  auto wide = Make(Config(5));
  for (int step = 1; step <= 4; ++step) ASSERT_TRUE(PushOnes(*wide, ids, step).ok());
  EXPECT_EQ(wide->num_rows(), 0);
  ASSERT_TRUE(PushOnes(*wide, ids, 5).ok());
  EXPECT_EQ(wide->num_rows(), 4000);
}

// Probability admission is a pure function of (seed, id): tables fed in any split and
// order keep the same ids; another seed keeps others.
TEST(Admission, ProbabilityAdmitsTheSameIdsEverywhere) {
  const std::vector<int64_t> ids = Range(17, 20000);
  auto whole = Make(Config(0, 0.25f));
  ASSERT_TRUE(PushOnes(*whole, ids, 1).ok());
  const int64_t kept = whole->num_rows();
  EXPECT_GT(kept, 20000 * 0.25 - 400);
  EXPECT_LT(kept, 20000 * 0.25 + 400);
  EXPECT_EQ(whole->refused_ids(), 20000 - kept);
  // Refused ids stay refused.
  ASSERT_TRUE(PushOnes(*whole, ids, 2).ok());
  EXPECT_EQ(whole->num_rows(), kept);

  auto a = Make(Config(0, 0.25f)), b = Make(Config(0, 0.25f));
  std::vector<int64_t> odd, even;
  for (size_t i = 0; i < ids.size(); ++i) (i % 2 ? odd : even).push_back(ids[ids.size() - 1 - i]);
  ASSERT_TRUE(PushOnes(*a, odd, 1).ok());
  ASSERT_TRUE(PushOnes(*b, even, 1).ok());
  std::set<int64_t> split = StoredIds(*a);
  const std::set<int64_t> from_b = StoredIds(*b);
  split.insert(from_b.begin(), from_b.end());
  EXPECT_EQ(split, StoredIds(*whole));

  auto other = Make(Config(0, 0.25f, /*seed=*/8));
  ASSERT_TRUE(PushOnes(*other, ids, 1).ok());
  EXPECT_NE(StoredIds(*other), StoredIds(*whole));
}

// With both, an id needs its count and its coin.
TEST(Admission, MinCountAndProbabilityTogether) {
  const std::vector<int64_t> ids = Range(29, 8000);
  auto coin_only = Make(Config(0, 0.5f));
  ASSERT_TRUE(PushOnes(*coin_only, ids, 1).ok());
  auto both = Make(Config(2, 0.5f));
  ASSERT_TRUE(PushOnes(*both, ids, 1).ok());
  EXPECT_EQ(both->num_rows(), 0);
  ASSERT_TRUE(PushOnes(*both, ids, 2).ok());
  EXPECT_EQ(StoredIds(*both), StoredIds(*coin_only));
}

// A row budget counts only the rows a push creates: ids held back take no room.
TEST(Admission, ABudgetCountsOnlyAdmittedRows) {
  auto t = Make(Config(2), /*budget=*/100);
  const std::vector<int64_t> many = Range(1, 300);
  ASSERT_TRUE(PushOnes(*t, many, 1).ok());  // counted, no row
  EXPECT_EQ(t->CheckRoomFor(many).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(PushOnes(*t, many, 2).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(t->num_rows(), 0);
  const std::vector<int64_t> few(many.begin(), many.begin() + 100);
  ASSERT_TRUE(PushOnes(*t, few, 3).ok());
  EXPECT_EQ(t->num_rows(), 100);
}

// Rows stored without a push (imports, restores) are not refused.
TEST(Admission, StoredRowsAreNeverRefused) {
  auto t = Make(Config(10));
  const std::vector<float> w(kDim, 2.0f);
  ASSERT_TRUE(t->PutRow(42, w, {}, RowMeta{}).ok());
  ASSERT_TRUE(PushOnes(*t, {42}, 1).ok());
  auto row = t->ReadRow(42);
  ASSERT_TRUE(row.ok());
  EXPECT_FLOAT_EQ(row->weights[0], 1.5f);
  EXPECT_EQ(t->refused_ids(), 0);
}

// A spill that keeps evicted rows in a map.
class MapSpill : public RowSpill {
 public:
  absl::Status Evict(int64_t id, const float* weights, const float*, const RowMeta& meta,
                     bool) override {
    rows[id] = {std::vector<float>(weights, weights + kDim), meta};
    return absl::OkStatus();
  }
  absl::StatusOr<bool> Fetch(int64_t id, float* weights, float*, RowMeta* meta,
                             bool* dirty) override {
    auto it = rows.find(id);
    if (it == rows.end()) return false;
    std::copy(it->second.first.begin(), it->second.first.end(), weights);
    *meta = it->second.second;
    *dirty = true;
    return true;
  }
  void Drop(int64_t id) override { rows.erase(id); }
  std::map<int64_t, std::pair<std::vector<float>, RowMeta>> rows;
};

// An evicting table: a row kept on disk was admitted before, even when the sketch that
// admitted it is gone (a restarted shard); ids never admitted still wait for their count.
TEST(Admission, RowsKeptOnDiskStayAdmittedAfterARestart) {
  v1::TableConfig c = Config(2);
  c.set_max_rows(1);
  c.mutable_eviction()->set_policy(v1::EVICTION_LRU);
  MapSpill spill;
  {
    auto t = Make(c, 1);
    t->set_spill(&spill);
    ASSERT_TRUE(PushOnes(*t, {5}, 1).ok());
    ASSERT_TRUE(PushOnes(*t, {5}, 2).ok());  // admitted
    ASSERT_TRUE(PushOnes(*t, {6}, 3).ok());
    ASSERT_TRUE(PushOnes(*t, {6}, 4).ok());  // admitted, evicts 5
    ASSERT_EQ(spill.rows.count(5), 1u);
  }
  auto restarted = Make(c, 1);
  restarted->set_spill(&spill);
  std::vector<float> initial(kDim), w(kDim);
  restarted->InitialWeights(5, initial.data());
  ASSERT_TRUE(PushOnes(*restarted, {5}, 5).ok());
  ASSERT_TRUE(PushOnes(*restarted, {7}, 5).ok());
  EXPECT_EQ(restarted->refused_ids(), 1);  // 7 only
  ASSERT_TRUE(restarted->Lookup(std::vector<int64_t>{5}, w.data(), false).ok());
  EXPECT_FLOAT_EQ(w[0], initial[0] - 1.0f);  // its first update, then this one
}

// The sketch is memory the table takes from creation: the memory budget counts it, and a
// sketch wider than the budget has room for is refused when the table is created.
TEST(Admission, TheMemoryBudgetCountsTheSketch) {
  InProcessOptions o;
  o.num_shards = 2;
  o.memory_limit = 64 << 20;
  auto c = NewInProcessCollection(o).value();
  v1::TableConfig fits = Config(3);
  fits.mutable_admission()->set_sketch_width(1 << 20);  // 4 MiB a shard
  ASSERT_TRUE(c->CreateTable(fits).ok());
  auto usage = c->Usage("ads");
  ASSERT_TRUE(usage.ok());
  EXPECT_GE(usage->budget_used_bytes, 2 * 4 * (1 << 20));
  EXPECT_GE(usage->memory_bytes, 2 * 4 * (1 << 20));
  v1::TableConfig wide = Config(3);
  wide.set_name("wide");
  wide.mutable_admission()->set_sketch_width(int64_t{1} << 24);  // 64 MiB a shard
  absl::Status s = c->CreateTable(wide);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("admission sketch"), std::string::npos) << s;
  // A dropped table gives its sketch back.
  ASSERT_TRUE(c->DropTable("ads").ok());
  v1::TableConfig plain = Config(0);
  plain.set_name("plain");
  ASSERT_TRUE(c->CreateTable(plain).ok());
  usage = c->Usage("plain");
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->budget_used_bytes, 0);
}

TEST(Admission, ConfigIsValidated) {
  for (const auto& [min_count, p, width] :
       std::vector<std::tuple<int, float, int64_t>>{{-1, 0.0f, 0},
                                                    {256, 0.0f, 0},
                                                    {2, -0.1f, 0},
                                                    {2, 1.5f, 0},
                                                    {2, std::nanf(""), 0},
                                                    {2, 0.5f, -1}}) {
    v1::TableConfig c = Config(min_count, p);
    c.mutable_admission()->set_sketch_width(width);
    auto t = EmbeddingTable::Create(c);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << min_count << " " << p;
    EXPECT_NE(t.status().message().find("admission."), std::string::npos) << t.status();
  }
  EXPECT_TRUE(EmbeddingTable::Create(Config(255, 1.0f)).ok());
}

}  // namespace
}  // namespace tessera::embedding
