#include "embedding/table_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::embedding {
namespace {

using ::testing::ElementsAre;

v1::TableConfig Config() {
  v1::TableConfig c;
  c.set_name("m.C1");
  c.set_dim(16);
  c.set_seed(3);
  c.mutable_optimizer()->set_type(v1::ADAGRAD);
  c.mutable_optimizer()->set_learning_rate(0.05f);
  return c;
}

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

}  // namespace
}  // namespace tessera::embedding
