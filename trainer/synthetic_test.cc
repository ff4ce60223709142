#include "trainer/synthetic.h"

#include <map>

#include "gtest/gtest.h"
#include "trainer/metrics.h"

namespace tessera::trainer {
namespace {

SyntheticConfig Config() {
  SyntheticConfig c;
  c.cardinalities = {5, 100, 1000, 50};
  c.seed = 3;
  return c;
}

TEST(SyntheticGenerator, BatchesArePureFunctionsOfTheirIndex) {
  auto g = SyntheticGenerator::Create(Config());
  ASSERT_TRUE(g.ok());
  Batch a, b, c;
  (*g)->MakeBatch(7, 64, &a);
  (*g)->MakeBatch(8, 64, &c);
  (*g)->MakeBatch(7, 64, &b);
  EXPECT_EQ(a.dense, b.dense);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_NE(a.ids, c.ids);
  ASSERT_EQ(a.ids.size(), 4u);
  EXPECT_EQ(a.offsets[2].back(), 64);
}

TEST(SyntheticGenerator, IdsFollowZipfPopularity) {
  auto g = SyntheticGenerator::Create(Config());
  ASSERT_TRUE(g.ok());
  Batch b;
  (*g)->MakeBatch(1, 20000, &b);
  std::map<int64_t, int> count;
  for (int64_t id : b.ids[2]) ++count[id];
  const int top = count[(*g)->IdOf(2, 0)];
  const int second = count[(*g)->IdOf(2, 1)];
  const int tenth = count[(*g)->IdOf(2, 9)];
  // Zipf(1.1): p(rank r) ~ r^-1.1, so rank 1 is 2^1.1 = 2.14x rank 2 and 10^1.1 = 12.6x rank 10.
  EXPECT_NEAR(static_cast<double>(top) / second, 2.14, 0.35);
  EXPECT_NEAR(static_cast<double>(top) / tenth, 12.6, 4.0);
  EXPECT_GT(count.size(), 300u);
}

TEST(SyntheticGenerator, LabelsFollowTheTeacherAndTeacherAucIsKnown) {
  auto g = SyntheticGenerator::Create(Config());
  ASSERT_TRUE(g.ok());
  Batch held = (*g)->MakeHeldOut(20000);
  ASSERT_EQ(held.size, 20000);
  double mean_p = 0, mean_y = 0;
  for (int i = 0; i < held.size; ++i) {
    mean_p += held.teacher_probability[i];
    mean_y += held.labels[i];
  }
  EXPECT_NEAR(mean_y / held.size, mean_p / held.size, 0.01) << "labels are Bernoulli(teacher)";
  const double auc = ExactAuc(held.teacher_probability, held.labels);
  EXPECT_GT(auc, 0.7);
  EXPECT_LT(auc, 0.99);
  // Held-out samples do not repeat a training batch.
  Batch train;
  (*g)->MakeBatch(0, 100, &train);
  EXPECT_NE(std::vector<float>(held.dense.begin(), held.dense.begin() + 13 * 100), train.dense);
}

TEST(SyntheticGenerator, RejectsBadConfigs) {
  SyntheticConfig c = Config();
  c.cardinalities[1] = 0;
  EXPECT_EQ(SyntheticGenerator::Create(c).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DefaultCardinalities(26).size(), 26u);
}

}  // namespace
}  // namespace tessera::trainer
