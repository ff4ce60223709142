#include "embedding/table_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/table_configs.h"

namespace tessera::embedding {
namespace {

using ::testing::ElementsAre;

v1::TableConfig Config() { return testing::TestTable("m.C1", 16, 3, v1::ADAGRAD, 0.05f); }

TEST(TableConfigDifferences, NamesEachDifferingFieldWithBothValues) {
  v1::TableConfig want = Config();
  EXPECT_TRUE(TableConfigDifferences(Config(), want).empty());
  want.mutable_optimizer()->set_learning_rate(0.5f);
  want.set_dtype(v1::BF16);
  want.mutable_eviction()->set_ttl_steps(100);
  EXPECT_THAT(TableConfigDifferences(Config(), want),
              ElementsAre("optimizer.learning_rate 0.05 (the table's) vs 0.5",
                          "eviction.ttl_steps 0 (the table's) vs 100",
                          "dtype FP32 (the table's) vs BF16"));
}

TEST(TableConfigDifferences, AnUnsetOptionalFieldReadsUnsetAndIgnoredFieldsAreSkipped) {
  v1::TableConfig want = Config();
  want.mutable_optimizer()->set_clip_norm(1.0f);
  want.set_seed(9);
  want.set_name("m.C2");
  EXPECT_THAT(TableConfigDifferences(Config(), want, {"name", "seed"}),
              ElementsAre("optimizer.clip_norm unset (the table's) vs 1"));
}

TEST(AlterOptimizer, PutsInTheFieldsSetAndKeepsTheRest) {
  v1::OptimizerConfig changes;
  changes.set_learning_rate(0.5f);
  changes.set_clip_norm(2.0f);
  auto altered = AlterOptimizer(Config(), changes);
  ASSERT_TRUE(altered.ok()) << altered.status();
  EXPECT_EQ(altered->optimizer().type(), v1::ADAGRAD);
  EXPECT_EQ(altered->optimizer().learning_rate(), 0.5f);
  EXPECT_EQ(altered->optimizer().clip_norm(), 2.0f);
  EXPECT_FALSE(altered->optimizer().has_epsilon());
  EXPECT_EQ(altered->dim(), 16);
  // The same change again gives the same config.
  auto again = AlterOptimizer(*altered, changes);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(TableConfigDifferences(*again, *altered).empty());
}

TEST(AlterOptimizer, RefusesAnotherTypeAndBadValues) {
  v1::OptimizerConfig other;
  other.set_type(v1::ADAM);
  auto refused = AlterOptimizer(Config(), other);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("is ADAGRAD and cannot become ADAM"));
  v1::OptimizerConfig same;
  same.set_type(v1::ADAGRAD);  // naming the table's own type is fine
  EXPECT_TRUE(AlterOptimizer(Config(), same).ok());
  v1::OptimizerConfig negative;
  negative.set_learning_rate(-1.0f);
  EXPECT_EQ(AlterOptimizer(Config(), negative).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::embedding
