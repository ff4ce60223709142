#include "trainer/sparse_step.h"

#include <map>
#include <random>

#include "embedding/inprocess_collection.h"
#include "gtest/gtest.h"

namespace tessera::trainer {
namespace {

constexpr int kDim = 8;

// Features' ids (Zipf-like repeats), one id per sample: a batch large enough for the
// gradients to run on the pool.
Batch BigBatch(int features, int size) {
  Batch b;
  b.Reset(features);
  b.size = size;
  std::mt19937_64 rng(17);
  for (int f = 0; f < features; ++f) {
    for (int i = 0; i < size; ++i) {
      b.ids[f].push_back(static_cast<int64_t>((rng() % 3000) * (rng() % 3)));
      b.offsets[f].push_back(i + 1);
    }
  }
  return b;
}

std::map<int64_t, std::vector<float>> RowsById(const embedding::TableGradients& part) {
  std::map<int64_t, std::vector<float>> rows;
  for (size_t u = 0; u < part.ids.size(); ++u) {
    rows[part.ids[u]].assign(part.gradients.begin() + u * kDim,
                             part.gradients.begin() + (u + 1) * kDim);
  }
  return rows;
}

TEST(SparseStep, GradientsAreTheSameForAnyPoolAndWithOrWithoutTheLookupsPlan) {
  const int features = 4, size = 6000;  // 24,000 ids: the pool's path
  const Batch batch = BigBatch(features, size);
  const Batch copy = batch;  // not looked up: no plan for it
  std::vector<std::string> names = {"a", "b", "c", "d"};
  std::vector<float> emb_grad(static_cast<size_t>(features) * size * kDim);
  std::mt19937 rng(2);
  for (float& g : emb_grad) g = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 997;

  std::vector<std::vector<embedding::TableGradients>> runs;
  std::vector<std::unique_ptr<SparseStep>> steps;  // the pushes point into them
  for (const int threads : {1, 3}) {
    auto pool = std::make_shared<base::ThreadPool>(threads);
    embedding::InProcessOptions o;
    o.num_shards = 3;
    o.pool = pool;
    auto tables = embedding::NewInProcessCollection(o).value();
    for (const std::string& n : names) {
      v1::TableConfig c;
      c.set_name(n);
      c.set_dim(kDim);
      c.mutable_optimizer()->set_type(v1::SGD);
      ASSERT_TRUE(tables->CreateTable(c).ok());
    }
    auto step = std::make_unique<SparseStep>();
    std::vector<float> emb(emb_grad.size());
    ASSERT_TRUE(step->Lookup(*tables, names, batch, kDim, true, absl::MakeSpan(emb)).ok());
    step->Gradients(names, batch, kDim, emb_grad.data(), *pool);
    ASSERT_EQ(step->pushes().size(), 4u);
    for (const auto& p : step->pushes()) EXPECT_NE(p.plan, nullptr) << "the lookup's plan";
    EXPECT_TRUE(step->after_lookup()) << "its rows were made by its lookup: no check round";
    runs.emplace_back(step->pushes().begin(), step->pushes().end());
    steps.push_back(std::move(step));
    // The same gradients without a plan (the batch this step did not look up).
    auto unplanned = std::make_unique<SparseStep>();
    unplanned->Gradients(names, copy, kDim, emb_grad.data(), *pool);
    for (const auto& p : unplanned->pushes()) EXPECT_EQ(p.plan, nullptr);
    EXPECT_FALSE(unplanned->after_lookup());
    for (int f = 0; f < features; ++f) {
      EXPECT_EQ(RowsById(unplanned->pushes()[f]), RowsById(runs.back()[f])) << "feature " << f;
    }
    steps.push_back(std::move(unplanned));
    // A read-only lookup makes no rows: its push is checked first.
    auto evaluated = std::make_unique<SparseStep>();
    ASSERT_TRUE(evaluated->Lookup(*tables, names, batch, kDim, false, absl::MakeSpan(emb)).ok());
    evaluated->Gradients(names, batch, kDim, emb_grad.data(), *pool);
    EXPECT_FALSE(evaluated->after_lookup());
    steps.push_back(std::move(evaluated));
  }
  for (int f = 0; f < features; ++f) {
    const auto& one = runs[0][f];
    const auto& three = runs[1][f];
    EXPECT_EQ(std::vector<int64_t>(one.ids.begin(), one.ids.end()),
              std::vector<int64_t>(three.ids.begin(), three.ids.end()));
    EXPECT_EQ(std::vector<float>(one.gradients.begin(), one.gradients.end()),
              std::vector<float>(three.gradients.begin(), three.gradients.end()));
  }
}

}  // namespace
}  // namespace tessera::trainer
