#include "embedding/memory_budget.h"

#include <filesystem>
#include <fstream>
#include <vector>

#include "embedding/embedding_table.h"
#include "embedding/inprocess_collection.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/table_configs.h"

namespace tessera::embedding {
namespace {

using ::testing::HasSubstr;

v1::TableConfig Config(const std::string& name) {
  return testing::TestTable(name, 8, 3, v1::SGD, 0.5f);
}

std::vector<int64_t> Range(int64_t first, int64_t n) {
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = first + i;
  return ids;
}

TEST(MemoryBudget, TakesWhatFitsAndNothingElse) {
  MemoryBudget b(100);
  EXPECT_TRUE(b.TryTake(60));
  EXPECT_FALSE(b.TryTake(41));
  EXPECT_EQ(b.used(), 60);
  EXPECT_TRUE(b.TryTake(40));
  b.Add(-30);
  EXPECT_TRUE(b.HasRoomFor(30));
  EXPECT_FALSE(b.HasRoomFor(31));
}

TEST(MemoryBudget, ANewRowPastTheBudgetIsRefusedAndNoRowChanges) {
  auto table = EmbeddingTable::Create(Config("users")).value();
  MemoryBudget budget(10 * table->row_bytes());  // ten rows
  table->set_memory_budget(&budget);
  std::vector<float> out(10 * 8);
  ASSERT_TRUE(table->Lookup(Range(0, 10), out.data()).ok());
  EXPECT_EQ(budget.used(), 10 * table->row_bytes());
  // An eleventh row: refused, naming the table and the budget.
  std::vector<float> one(8);
  const absl::Status s = table->Lookup(Range(10, 1), one.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("table 'users': the memory budget for rows"));
  EXPECT_THAT(s.message(), HasSubstr("--memory_limit"));
  EXPECT_EQ(table->num_rows(), 10);
  // A push with one new id among stored ones is refused whole; stored rows do not move.
  const std::vector<int64_t> mixed = {3, 4, 99};
  const std::vector<float> grads(3 * 8, 1.0f);
  EXPECT_EQ(table->ApplyUniqueGradients(mixed, grads.data(), 1).code(),
            absl::StatusCode::kResourceExhausted);
  std::vector<float> after(10 * 8);
  ASSERT_TRUE(table->Lookup(Range(0, 10), after.data(), /*insert_missing=*/false).ok());
  EXPECT_EQ(after, out);
  // Pushes to stored rows go on.
  const std::vector<int64_t> stored = {3, 4};
  EXPECT_TRUE(table->ApplyUniqueGradients(stored, grads.data(), 1).ok());
  // A row let go gives its bytes back.
  table->Forget(3);
  EXPECT_EQ(budget.used(), 9 * table->row_bytes());
  EXPECT_TRUE(table->Lookup(Range(10, 1), one.data()).ok());
  table.reset();
  EXPECT_EQ(budget.used(), 0);
}

TEST(MemoryBudget, ATableWithEvictionEvictsInsteadOfRefusing) {
  v1::TableConfig config = Config("lru");
  config.mutable_eviction()->set_policy(v1::EVICTION_LRU);
  config.set_max_rows(1000);  // eviction needs a row budget; the memory budget is smaller
  auto table = EmbeddingTable::Create(config, 1000).value();
  MemoryBudget budget(20 * table->row_bytes());
  table->set_memory_budget(&budget);
  std::vector<float> out(8);
  for (int64_t id = 0; id < 60; ++id) {
    const int64_t ids[] = {id};
    ASSERT_TRUE(table->ApplyUniqueGradients(ids, out.data(), id).ok()) << id;
  }
  EXPECT_LE(table->num_rows(), 21);  // a concurrent insert may pass it by one
  EXPECT_GE(table->evictions(), 39);
  EXPECT_LE(budget.used(), budget.limit() + table->row_bytes());
}

TEST(MemoryBudget, AnInProcessCollectionSharesOneBudgetOverItsTablesAndShards) {
  InProcessOptions options;
  options.num_shards = 2;
  auto probe = EmbeddingTable::Create(Config("probe")).value();
  options.memory_limit = 50 * probe->row_bytes();
  auto c = NewInProcessCollection(options).value();
  ASSERT_TRUE(c->CreateTable(Config("a")).ok());
  ASSERT_TRUE(c->CreateTable(Config("b")).ok());
  const std::vector<float> grads(30 * 8, 0.1f);
  ASSERT_TRUE(c->PushGradients("a", Range(0, 30), grads, 1).ok());
  const absl::Status s = c->PushGradients("b", Range(0, 30), grads, 1);  // 60 > 50
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("table 'b'"));
  EXPECT_EQ(c->Usage("b")->rows, 0);  // refused whole
  ASSERT_TRUE(c->DropTable("a").ok());
  EXPECT_TRUE(c->PushGradients("b", Range(0, 30), grads, 2).ok());
  // No budget at all: negative.
  options.memory_limit = -1;
  auto unlimited = NewInProcessCollection(options).value();
  ASSERT_TRUE(unlimited->CreateTable(Config("a")).ok());
  EXPECT_TRUE(unlimited->PushGradients("a", Range(0, 30), grads, 1).ok());
}

TEST(MemoryBudget, TheDefaultIsTheTightestCgroupLimitLessWhatServingNeeds) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / "tessera-cgroup-test";
  fs::remove_all(root);
  auto write = [](const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text << "\n";
  };
  const std::string self = (root / "self").string();
  // cgroup v2: this process in /jobs/shard, whose parent /jobs has the tighter limit.
  write(root / "self", "0::/jobs/shard");
  write(root / "jobs" / "shard" / "memory.max", "max");
  write(root / "jobs" / "memory.max", "629145600");  // 600 MiB
  EXPECT_EQ(DefaultMemoryBudget(root.string(), self), (600 - 128) * (int64_t{1} << 20));
  write(root / "jobs" / "shard" / "memory.max", "314572800");  // its own, 300 MiB
  EXPECT_EQ(DefaultMemoryBudget(root.string(), self), (300 - 128) * (int64_t{1} << 20));
  // cgroup v1: the memory controller's own hierarchy (listed with others on one line).
  write(root / "self", "9:name=systemd:/\n4:cpu,memory:/process/a\n0::/");
  write(root / "memory" / "process" / "a" / "memory.limit_in_bytes", "9223372036854771712");
  write(root / "memory" / "process" / "memory.limit_in_bytes", "17179869184");  // 16 GiB
  EXPECT_EQ(DefaultMemoryBudget(root.string(), self), int64_t{14} << 30);  // less an eighth
  // No limit anywhere: most of physical memory.
  write(root / "memory" / "process" / "memory.limit_in_bytes", "9223372036854771712");
  EXPECT_GT(DefaultMemoryBudget(root.string(), self), int64_t{64} << 20);
  fs::remove_all(root);
}

}  // namespace
}  // namespace tessera::embedding
