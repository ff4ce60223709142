// A batched request's decoding into a DecodedBatch that a server thread keeps for its next
// request: each table's config as the server holds it at that request, whatever the batch
// held before.
#include "server/lookup_request.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/table_configs.h"
#include "wire/packed_bytes.h"

namespace tessera::server {
namespace {

// The configs a server holds now: replaced, never changed in place, as servers do.
class HeldConfigs {
 public:
  void Set(const v1::TableConfig& config) {
    held_[config.name()] = std::make_shared<const v1::TableConfig>(config);
  }
  ConfigLookup Lookup() {
    return [this](const std::string& table,
                  std::shared_ptr<TableCounters>*) -> absl::StatusOr<ConfigRef> {
      ++lookups_;
      auto it = held_.find(table);
      if (it == held_.end()) return absl::NotFoundError(table);
      return it->second;
    };
  }
  int lookups() const { return lookups_; }

 private:
  std::map<std::string, ConfigRef> held_;
  int lookups_ = 0;
};

// A push of one row (id 1) of each of `tables`, of dim `dim`.
v1::BatchPushRequest Push(const std::vector<std::string>& tables, int dim) {
  v1::BatchPushRequest request;
  const std::vector<int64_t> ids = {1};
  const std::vector<float> gradients(dim, 0.5f);
  for (const std::string& t : tables) {
    v1::TableGradients* part = request.add_tables();
    part->set_table(t);
    wire::SetPacked<int64_t>(ids, part->mutable_ids());
    wire::SetPacked<float>(gradients, part->mutable_gradients());
  }
  return request;
}

// A lookup of rows 1 and 2 of each of `tables`.
v1::BatchLookupRequest Lookup(const std::vector<std::string>& tables) {
  v1::BatchLookupRequest request;
  const std::vector<int64_t> ids = {1, 2};
  for (const std::string& t : tables) {
    v1::TableLookup* part = request.add_tables();
    part->set_table(t);
    wire::SetPacked<int64_t>(ids, part->mutable_ids());
  }
  return request;
}

float LearningRate(const DecodedBatch& batch, size_t i) {
  return batch.configs[i].optimizer().learning_rate();
}

TEST(DecodedBatch, AKeptBatchTakesEveryTablesConfigAsItIsHeldNow) {
  HeldConfigs held;
  held.Set(testing::TestTable("a", 2, 1, v1::SGD, 0.1f));
  held.Set(testing::TestTable("b", 2, 1, v1::SGD, 0.2f));
  DecodedBatch batch;  // kept from request to request, as a server thread keeps its own
  ASSERT_TRUE(PrepareBatchPush(Push({"a", "b"}, 2), held.Lookup(), &batch).ok());
  ASSERT_EQ(batch.configs.size(), 2u);
  EXPECT_EQ(LearningRate(batch, 0), 0.1f);
  EXPECT_EQ(LearningRate(batch, 1), 0.2f);

  // "b" altered between two requests: the same slot, another config.
  held.Set(testing::TestTable("b", 2, 1, v1::ADAGRAD, 0.3f));
  ASSERT_TRUE(PrepareBatchPush(Push({"a", "b"}, 2), held.Lookup(), &batch).ok());
  EXPECT_EQ(LearningRate(batch, 0), 0.1f);
  EXPECT_EQ(LearningRate(batch, 1), 0.3f);
  EXPECT_EQ(batch.configs[1].optimizer().type(), v1::ADAGRAD);
  // The checked push points at the configs it was checked against.
  ASSERT_EQ(batch.checked.configs().size(), 2u);
  EXPECT_EQ(batch.checked.configs()[1].optimizer().learning_rate(), 0.3f);

  // The same tables in the other order, then fewer of them.
  ASSERT_TRUE(PrepareBatchPush(Push({"b", "a"}, 2), held.Lookup(), &batch).ok());
  EXPECT_EQ(batch.configs[0].name(), "b");
  EXPECT_EQ(LearningRate(batch, 0), 0.3f);
  EXPECT_EQ(batch.configs[1].name(), "a");
  EXPECT_EQ(LearningRate(batch, 1), 0.1f);
  ASSERT_TRUE(PrepareBatchPush(Push({"a"}, 2), held.Lookup(), &batch).ok());
  ASSERT_EQ(batch.configs.size(), 1u);
  EXPECT_EQ(batch.configs[0].name(), "a");

  // A table made again under its name with another dim, after a request that failed on an
  // unknown table half-way: the next request has the new dim, and its gradients are
  // checked against it.
  EXPECT_EQ(PrepareBatchPush(Push({"a", "gone"}, 2), held.Lookup(), &batch).code(),
            absl::StatusCode::kNotFound);
  held.Set(testing::TestTable("a", 4, 1, v1::SGD, 0.1f));
  EXPECT_EQ(PrepareBatchPush(Push({"a"}, 2), held.Lookup(), &batch).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(PrepareBatchPush(Push({"a"}, 4), held.Lookup(), &batch).ok());
  EXPECT_EQ(batch.configs[0].dim(), 4);
}

TEST(DecodedBatch, AKeptLookupBatchSizesEachAnswerByTheTablesDimNow) {
  HeldConfigs held;
  held.Set(testing::TestTable("a", 2, 1, v1::SGD, 0.1f));
  held.Set(testing::TestTable("b", 3, 1, v1::SGD, 0.1f));
  DecodedBatch batch;
  const AnswerLimit limit{1000, "test limit"};
  v1::BatchLookupResponse response;
  ASSERT_TRUE(PrepareBatchLookup(Lookup({"a", "b"}), held.Lookup(), limit, &response, &batch).ok());
  EXPECT_EQ(response.tables(0).dim(), 2);
  EXPECT_EQ(response.tables(1).dim(), 3);
  EXPECT_EQ(batch.lookups[1].out.size(), 2u * 3);

  held.Set(testing::TestTable("b", 8, 1, v1::SGD, 0.1f));  // "b" made again, wider
  response.Clear();
  ASSERT_TRUE(PrepareBatchLookup(Lookup({"b", "a"}), held.Lookup(), limit, &response, &batch).ok());
  EXPECT_EQ(response.tables(0).dim(), 8);
  EXPECT_EQ(batch.lookups[0].out.size(), 2u * 8);
  EXPECT_EQ(response.tables(1).dim(), 2);
  EXPECT_EQ(batch.configs[0].dim(), 8);
  EXPECT_EQ(batch.configs[1].dim(), 2);
  EXPECT_EQ(held.lookups(), 4);  // one per table per request: nothing cached past the server
}

}  // namespace
}  // namespace tessera::server
