// Checkpoints through the host (CheckpointThroughHost), with an in-process collection
// standing in for the GPU's device tables: any collection that exports and imports rows
// takes this path. A checkpoint taken through it is an ordinary host checkpoint, and a
// host checkpoint restores through it.

#include "embedding/storage/host_checkpoints.h"

#include <random>
#include <vector>

#include "embedding/inprocess_collection.h"
#include "gtest/gtest.h"
#include "tests/support/random_pushes.h"
#include "tests/support/table_configs.h"
#include "tests/support/temp_dir.h"

namespace tessera::storage {
namespace {

constexpr int kDim = 8;

// Adam: state and update counts must travel.
v1::TableConfig Config() { return testing::TestTable("t", kDim, 5, v1::ADAM, 0.05f); }

std::unique_ptr<DurableCollection> OpenStore(const std::string& dir) {
  DurableOptions o;
  o.data_dir = dir;
  auto c = DurableCollection::Open(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

std::unique_ptr<embedding::EmbeddingCollection> ThroughHost(const std::string& dir) {
  auto live = embedding::NewInProcessCollection(2).value();
  auto c = CheckpointThroughHost(std::move(live), OpenStore(dir));
  EXPECT_TRUE(c->CreateTable(Config()).ok());
  return c;
}

void Train(embedding::EmbeddingCollection& c, int first_step, int steps) {
  testing::RandomPushes pushes(first_step, 40, 100, kDim);
  std::vector<int64_t> ids;
  std::vector<float> grads;
  for (int s = first_step; s < first_step + steps; ++s) {
    pushes.Next(&ids, &grads);
    ASSERT_TRUE(c.PushGradients("t", ids, grads, s).ok());
  }
}

std::vector<float> Rows(embedding::EmbeddingCollection& c) {
  std::vector<int64_t> ids(100);
  for (int i = 0; i < 100; ++i) ids[i] = i;
  std::vector<float> out(ids.size() * kDim);
  embedding::LookupOptions o;
  o.insert_missing = false;
  EXPECT_TRUE(c.Lookup("t", ids, absl::MakeSpan(out), o).ok());
  return out;
}

TEST(CheckpointThroughHost, RestoresItsCheckpointAndAHostRunReadsIt) {
  testing::ScopedTempDir dir;
  std::vector<float> at_checkpoint, continued;
  {
    auto c = ThroughHost(dir.path);
    Train(*c, 1, 5);
    ASSERT_TRUE(c->checkpointing()->Checkpoint(5, {{"dense", "d5"}}).ok());
    at_checkpoint = Rows(*c);
    Train(*c, 6, 3);
    continued = Rows(*c);
    ASSERT_NE(continued, at_checkpoint);
    embedding::Attachments attachments;
    const auto info = c->checkpointing()->Restore(-1, &attachments);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->step, 5);
    EXPECT_EQ(attachments["dense"], "d5");
    EXPECT_EQ(Rows(*c), at_checkpoint);
    // The optimizer's state came back too: the same pushes give the same rows again.
    Train(*c, 6, 3);
    EXPECT_EQ(Rows(*c), continued);
  }
  // A host run (the store alone, as tessera-train --shards=inproc:N --data_dir) resumes
  // the checkpoint and continues to the same rows.
  auto host = OpenStore(dir.path);
  embedding::Attachments attachments;
  ASSERT_TRUE(host->Restore(-1, &attachments).ok());
  EXPECT_EQ(Rows(*host), at_checkpoint);
  Train(*host, 6, 3);
  EXPECT_EQ(Rows(*host), continued);
}

TEST(CheckpointThroughHost, ResumesACheckpointTakenByAHostRun) {
  testing::ScopedTempDir dir;
  std::vector<float> at_checkpoint, continued;
  {
    auto host = OpenStore(dir.path);
    ASSERT_TRUE(host->CreateTable(Config()).ok());
    Train(*host, 1, 4);
    ASSERT_TRUE(host->Checkpoint(4, {{"dense", "d4"}}).ok());
    at_checkpoint = Rows(*host);
    Train(*host, 5, 2);
    continued = Rows(*host);
  }
  auto c = ThroughHost(dir.path);
  embedding::Attachments attachments;
  ASSERT_TRUE(c->checkpointing()->Restore(-1, &attachments).ok());
  EXPECT_EQ(attachments["dense"], "d4");
  EXPECT_EQ(Rows(*c), at_checkpoint);
  Train(*c, 5, 2);
  EXPECT_EQ(Rows(*c), continued);
}

TEST(CheckpointThroughHost, RefusesATableTheStoreHoldsWithAnotherConfig) {
  testing::ScopedTempDir dir;
  {
    auto host = OpenStore(dir.path);
    ASSERT_TRUE(host->CreateTable(Config()).ok());
  }
  auto c = CheckpointThroughHost(embedding::NewInProcessCollection(1).value(), OpenStore(dir.path));
  v1::TableConfig other = Config();
  other.mutable_optimizer()->set_learning_rate(0.5f);
  const absl::Status s = c->CreateTable(other);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(s.message().find("optimizer.learning_rate"), std::string::npos) << s;
  EXPECT_TRUE(c->ListTables()->empty());
  EXPECT_TRUE(c->CreateTable(Config()).ok());  // the store's own config is fine
}

}  // namespace
}  // namespace tessera::storage
