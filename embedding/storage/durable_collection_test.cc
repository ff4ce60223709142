#include "embedding/storage/durable_collection.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "embedding/embedding_table.h"
#include "embedding/storage/files.h"
#include "embedding/storage/row_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/faulty_store.h"
#include "tests/support/random_pushes.h"
#include "tests/support/stored_rows.h"
#include "tests/support/table_configs.h"
#include "tests/support/temp_dir.h"

namespace tessera::storage {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

using ScopedDir = testing::ScopedTempDir;

// A directory that outlives the test (a store reopened by another harness).
std::string TempDir() {
  std::string dir = testing::MakeTempDir("tessera-durable");
  EXPECT_FALSE(dir.empty());
  return dir;
}

v1::TableConfig Config(const std::string& name, int dim, v1::Durability durability,
                       v1::OptimizerType opt = v1::ADAGRAD) {
  return testing::TestTable(name, dim, 11, opt, 0.05f, durability);
}

struct Harness {
  explicit Harness(const std::string& dir, int shards = 1) {
    options.data_dir = dir;
    options.num_shards = shards;
    options.log = [this](const std::string& line) { log.push_back(line); };
    options.open_store = testing::FaultyRocksDbStores(&faults);
  }
  std::unique_ptr<DurableCollection> Open() {
    auto c = DurableCollection::Open(options);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }
  DurableOptions options;
  std::vector<std::string> log;
  testing::StoreFaults faults;
};

std::vector<float> Read(embedding::EmbeddingCollection& c, const std::string& table,
                        const std::vector<int64_t>& ids, int dim) {
  std::vector<float> out(ids.size() * dim);
  embedding::LookupOptions o;
  o.insert_missing = false;
  EXPECT_TRUE(c.Lookup(table, ids, absl::MakeSpan(out), o).ok());
  return out;
}

// Pushes `steps` batches of random gradients over ids [0, 200).
void Train(embedding::EmbeddingCollection& c, const std::string& table, int dim, int first_step,
           int steps, uint64_t seed) {
  testing::RandomPushes pushes(seed, 64, 200, dim);
  std::vector<int64_t> ids;
  std::vector<float> grads;
  for (int s = first_step; s < first_step + steps; ++s) {
    pushes.Next(&ids, &grads);
    ASSERT_TRUE(c.PushGradients(table, ids, grads, s).ok());
  }
}

// Flips a byte in the middle of the weights of a row of table id 1 (one near the end of
// the key range, so that its block holds rows only) in the table files of the store in
// `db`; each changed file is written anew, so a hard link to it elsewhere (a checkpoint's,
// the live store's) keeps its bytes.
::testing::AssertionResult FlipAByteOfARow(const std::string& db) {
  std::string value;
  {
    auto store = OpenRocksDbStore(db, {});
    if (!store.ok()) return ::testing::AssertionFailure() << store.status();
    for (int64_t id = 199; id > 100 && value.empty(); --id) {
      auto v = (*store)->Get(RowKey(1, id));
      if (!v.ok()) return ::testing::AssertionFailure() << v.status();
      if (v->has_value()) value = **v;
    }
  }
  if (value.empty()) return ::testing::AssertionFailure() << "no row of table 1 in " << db;
  bool flipped = false;
  for (const auto& e : fs::directory_iterator(db)) {
    if (e.path().extension() != ".sst") continue;
    auto bytes = ReadFile(e.path().string());
    if (!bytes.ok()) return ::testing::AssertionFailure() << bytes.status();
    const size_t at = bytes->find(value);
    if (at == std::string::npos) continue;
    (*bytes)[at + 40] ^= 0x10;
    const std::string fresh = e.path().string() + ".new";
    std::ofstream(fresh, std::ios::binary | std::ios::trunc) << *bytes;
    fs::rename(fresh, e.path());
    flipped = true;
  }
  if (!flipped) return ::testing::AssertionFailure() << "the row is in no table file";
  return ::testing::AssertionSuccess();
}

std::vector<int64_t> AllIds() {
  std::vector<int64_t> ids(200);
  for (int i = 0; i < 200; ++i) ids[i] = i;
  return ids;
}

TEST(DurableCollection, WriteThroughTableComesBackWithEveryAcknowledgedPush) {
  ScopedDir dir;
  Harness h(dir.path);
  std::vector<float> expected;
  {
    auto c = h.Open();
    ASSERT_TRUE(c->CreateTable(Config("wt", 8, v1::WRITE_THROUGH)).ok());
    Train(*c, "wt", 8, 0, 20, 1);
    expected = Read(*c, "wt", AllIds(), 8);
  }  // no checkpoint: only the write-through log has the updates
  auto c = h.Open();
  auto tables = c->ListTables();
  ASSERT_TRUE(tables.ok());
  ASSERT_EQ(tables->size(), 1u);
  EXPECT_EQ((*tables)[0].durability(), v1::WRITE_THROUGH);
  EXPECT_EQ(Read(*c, "wt", AllIds(), 8), expected);  // bit-identical
  // Optimizer state came back too: one more identical step gives identical rows.
  auto fresh_dir = ScopedDir();
  Harness h2(fresh_dir.path);
  auto reference = h2.Open();
  ASSERT_TRUE(reference->CreateTable(Config("wt", 8, v1::WRITE_THROUGH)).ok());
  Train(*reference, "wt", 8, 0, 20, 1);
  Train(*reference, "wt", 8, 20, 1, 99);
  Train(*c, "wt", 8, 20, 1, 99);
  EXPECT_EQ(Read(*c, "wt", AllIds(), 8), Read(*reference, "wt", AllIds(), 8));
}

TEST(DurableCollection, WriteThroughPushRecordsSurviveAReopenUpToTheirLimit) {
  ScopedDir dir;
  Harness h(dir.path);
  h.options.push_records = 3;
  const std::vector<int64_t> ids = {5, 6, 5};
  const std::vector<float> g(ids.size() * 4, 0.25f);
  auto tag = [](uint64_t seq) { return embedding::PushTag{{9, seq}, 1}; };
  {
    auto c = h.Open();
    ASSERT_TRUE(c->CreateTable(Config("wt", 4, v1::WRITE_THROUGH)).ok());
    ASSERT_TRUE(c->CreateTable(Config("ck", 4, v1::CHECKPOINT)).ok());
    ASSERT_TRUE(c->PushGradientsRecorded("ck", ids, g, 1, tag(100)).ok());
    EXPECT_FALSE(c->RecordedPush(tag(100)).has_value()) << "CHECKPOINT pushes are not recorded";
    for (uint64_t seq = 1; seq <= 5; ++seq) {
      ASSERT_TRUE(c->PushGradientsRecorded("wt", ids, g, 1, tag(seq)).ok());
    }
    EXPECT_EQ(c->RecordedPush(tag(5)), std::optional<int64_t>(2));  // distinct rows
    EXPECT_FALSE(c->RecordedPush(tag(2)).has_value()) << "only the newest 3 are kept";
    // A push the disk refuses is not recorded.
    h.faults.writes = true;
    EXPECT_FALSE(c->PushGradientsRecorded("wt", ids, g, 1, tag(6)).ok());
    h.faults.writes = false;
    EXPECT_FALSE(c->RecordedPush(tag(6)).has_value());
  }
  auto c = h.Open();
  for (uint64_t seq = 1; seq <= 6; ++seq) {
    EXPECT_EQ(c->RecordedPush(tag(seq)).has_value(), seq >= 3 && seq <= 5) << "sequence " << seq;
  }
  EXPECT_FALSE(c->RecordedPush({{9, 5}, 0}).has_value()) << "another part of the same request";
  // A record is made and read again in order after the reopen.
  ASSERT_TRUE(c->PushGradientsRecorded("wt", ids, g, 1, tag(7)).ok());
  EXPECT_TRUE(c->RecordedPush(tag(7)).has_value());
  EXPECT_FALSE(c->RecordedPush(tag(3)).has_value());
}

TEST(DurableCollection, AWriteThroughPushPastTheMemoryBudgetIsRefusedWhole) {
  ScopedDir dir;
  Harness h(dir.path, /*shards=*/3);
  auto probe = embedding::EmbeddingTable::Create(Config("probe", 4, v1::WRITE_THROUGH)).value();
  h.options.memory_limit = 40 * probe->row_bytes();  // 40 rows over all three shards
  auto c = h.Open();
  ASSERT_TRUE(c->CreateTable(Config("w", 4, v1::WRITE_THROUGH)).ok());
  std::vector<int64_t> ids(30);
  for (int i = 0; i < 30; ++i) ids[i] = i;
  std::vector<float> grads(30 * 4, 0.5f);
  ASSERT_TRUE(c->PushGradients("w", ids, grads, 1).ok());
  // 15 more: each shard alone has room for its ~5 (10 left), together they do not.
  ids.assign(15, 0);
  for (int i = 0; i < 15; ++i) ids[i] = 100 + i;
  grads.assign(15 * 4, 0.5f);
  const absl::Status s = c->PushGradients("w", ids, grads, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("memory budget"));
  EXPECT_EQ(c->Usage("w")->rows, 30);
}

TEST(DurableCollection, CheckpointTableComesBackAsOfItsNewestCheckpoint) {
  ScopedDir dir;
  Harness h(dir.path, /*shards=*/3);
  std::vector<float> at_checkpoint;
  {
    auto c = h.Open();
    ASSERT_TRUE(c->CreateTable(Config("ck", 4, v1::CHECKPOINT)).ok());
    Train(*c, "ck", 4, 0, 10, 2);
    auto info = c->Checkpoint(10, {});
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->step, 10);
    EXPECT_GT(info->bytes, 0);
    at_checkpoint = Read(*c, "ck", AllIds(), 4);
    Train(*c, "ck", 4, 10, 5, 3);  // lost: never checkpointed
    EXPECT_NE(Read(*c, "ck", AllIds(), 4), at_checkpoint);
  }
  // Reopened with a different in-memory shard count: rows are keyed by id alone.
  h.options.num_shards = 2;
  auto c = h.Open();
  EXPECT_EQ(Read(*c, "ck", AllIds(), 4), at_checkpoint);
}

// Fixed-vocabulary tables are durable like others: write-through rows and checkpoints
// come back (onto another in-memory shard count), and a restore puts rows updated after
// the checkpoint back to what it holds (rows it does not hold: their initial weights).
TEST(DurableCollection, FixedVocabularyTablesComeBackAndRestore) {
  ScopedDir dir;
  Harness h(dir.path, /*shards=*/3);
  v1::TableConfig wt = Config("fixed_wt", 4, v1::WRITE_THROUGH, v1::ADAM);
  wt.set_vocabulary_size(200);
  v1::TableConfig ck = Config("fixed_ck", 4, v1::CHECKPOINT);
  ck.set_vocabulary_size(1000);
  std::vector<float> wt_rows, ck_rows, ck_initial;
  {
    auto c = h.Open();
    ASSERT_TRUE(c->CreateTable(wt).ok());
    ASSERT_TRUE(c->CreateTable(ck).ok());
    ck_initial = Read(*c, "fixed_ck", AllIds(), 4);
    Train(*c, "fixed_wt", 4, 0, 10, 8);
    Train(*c, "fixed_ck", 4, 0, 10, 9);
    ASSERT_TRUE(c->Checkpoint(10, {}).ok());
    ck_rows = Read(*c, "fixed_ck", AllIds(), 4);
    Train(*c, "fixed_ck", 4, 10, 3, 10);  // not checkpointed
    wt_rows = Read(*c, "fixed_wt", AllIds(), 4);
    const std::vector<float> g(4, 1.0f);
    EXPECT_EQ(c->PushGradients("fixed_ck", {1000}, g, 13).code(),
              absl::StatusCode::kInvalidArgument);
  }
  h.options.num_shards = 2;
  auto c = h.Open();
  EXPECT_EQ(Read(*c, "fixed_wt", AllIds(), 4), wt_rows);
  EXPECT_EQ(Read(*c, "fixed_ck", AllIds(), 4), ck_rows);
  Train(*c, "fixed_ck", 4, 10, 3, 11);
  EXPECT_NE(Read(*c, "fixed_ck", AllIds(), 4), ck_rows);
  ASSERT_TRUE(c->Restore(10, nullptr).ok());
  EXPECT_EQ(Read(*c, "fixed_ck", AllIds(), 4), ck_rows);
  EXPECT_NE(ck_rows, ck_initial);
}

// A harness for shard `k` of a cluster of `n` on `dir`.
std::unique_ptr<Harness> ClusterShard(const std::string& dir, int k, int n) {
  auto h = std::make_unique<Harness>(dir);
  h->options.cluster_shard_index = k;
  h->options.cluster_num_shards = n;
  return h;
}

// The moving rows of a live reshard for shard 0 of 3 (ids 0 mod 3 below 600): those shard 0
// of 2 keeps as `held` has them, the others made up.
embedding::RowBlock MovingForZeroOfThree(const testing::RowMap& held) {
  embedding::RowBlock b;
  b.dim = 4;
  b.state_floats = 4;
  for (int64_t id = 0; id < 600; id += 3) {
    std::vector<float> row(8, 0.125f * static_cast<float>(id));
    if (auto it = held.find(id); it != held.end()) row = it->second;
    b.Append(id, row.data(), row.data() + 4, 1, 1);
  }
  return b;
}

// A fixed vocabulary moved live on a durable write-through shard: a crash before the
// switch opens the old place as it was (the moving rows on disk are not its own and are
// not loaded; the rows it keeps are not overwritten by their moving copies), and after
// the switch and Repartition the directory opens at the new place with the moving rows.
TEST(DurableCollection, AFixedVocabularyMovedLiveOpensAtEitherPlace) {
  ScopedDir dir;
  v1::TableConfig fixed = Config("fixed", 4, v1::WRITE_THROUGH);
  fixed.set_vocabulary_size(600);
  std::vector<int64_t> even;
  for (int64_t id = 0; id < 400; id += 2) even.push_back(id);
  testing::RowMap copied, old_place;
  {
    auto h = ClusterShard(dir.path, 0, 2);
    auto c = h->Open();
    ASSERT_TRUE(c->CreateTable(fixed).ok());
    ASSERT_TRUE(c->PushGradients("fixed", even, std::vector<float>(even.size() * 4, 0.5f), 1).ok());
    copied = testing::StoredRows(*c, "fixed");
    // Row 6 (kept) changes after the copy read it: its moving copy is stale.
    ASSERT_TRUE(c->PushGradients("fixed", {6, 8}, std::vector<float>(8, -1.0f), 2).ok());
    old_place = testing::StoredRows(*c, "fixed");
    ASSERT_NE(old_place.at(6), copied.at(6));
    ASSERT_TRUE(c->ImportMovingRows("fixed", MovingForZeroOfThree(copied), 0, 3).ok());
  }  // a crash before the commit
  {
    auto h = ClusterShard(dir.path, 0, 2);
    auto c = h->Open();
    ASSERT_NE(c, nullptr);
    EXPECT_TRUE(testing::StoredRows(*c, "fixed") == old_place) << "the old place after a crash";
    // The move again, caught up, and committed.
    ASSERT_TRUE(c->ImportMovingRows("fixed", MovingForZeroOfThree(old_place), 0, 3).ok());
    ASSERT_TRUE(c->SwitchPlace(0, 3).ok());
    ASSERT_TRUE(c->Repartition(0, 3).ok());
  }
  const testing::RowMap want = testing::RowsOf(MovingForZeroOfThree(old_place));
  auto h = ClusterShard(dir.path, 0, 3);
  auto c = h->Open();
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(testing::StoredRows(*c, "fixed") == want) << "the new place after a restart";
  EXPECT_EQ(c->Usage("fixed").value().rows, static_cast<int64_t>(want.size()));
}

// Rows a 3-to-2 reshard brings shard 1 of 3 (ids below 600 that shard 2 of 3 owns and
// shard 1 of 2 will), made up.
embedding::RowBlock MovingForOneOfTwo(const v1::TableConfig& config) {
  embedding::RowBlock b;
  b.dim = 4;
  b.state_floats = 4;
  for (int64_t id = 0; id < 600; ++id) {
    if (embedding::ShardOfRow(config, id, 3) != 2 || embedding::ShardOfRow(config, id, 2) != 1)
      continue;
    const std::vector<float> row(8, 0.125f * static_cast<float>(id));
    b.Append(id, row.data(), row.data() + 4, 1, 1);
  }
  return b;
}

// A reshard given up after a durable write-through shard took rows of a dynamic table
// for its next place leaves none of them, in memory or on disk: DropMovingRows (the
// abort) forgets them, and a shard that crashed before the abort does not load them and
// erases them at it. Its own rows stay as they were.
TEST(DurableCollection, AGivenUpReshardLeavesNoRowItDoesNotOwn) {
  const v1::TableConfig dyn = Config("dyn", 4, v1::WRITE_THROUGH);
  std::vector<int64_t> own;
  for (int64_t id = 0; id < 600; ++id) {
    if (embedding::ShardOfRow(dyn, id, 3) == 1) own.push_back(id);
  }
  const embedding::RowBlock moving = MovingForOneOfTwo(dyn);
  ASSERT_GT(moving.ids.size(), 50u);
  for (const bool crash : {false, true}) {
    SCOPED_TRACE(crash ? "a crash before the abort" : "aborted");
    ScopedDir dir;
    testing::RowMap before;
    {
      auto h = ClusterShard(dir.path, 1, 3);
      auto c = h->Open();
      ASSERT_TRUE(c->CreateTable(dyn).ok());
      ASSERT_TRUE(c->PushGradients("dyn", own, std::vector<float>(own.size() * 4, 0.5f), 1).ok());
      before = testing::StoredRows(*c, "dyn");
      ASSERT_TRUE(c->ImportMovingRows("dyn", moving, 1, 2).ok());
      ASSERT_EQ(testing::StoredRows(*c, "dyn").size(), before.size() + moving.ids.size());
      if (!crash) {
        ASSERT_TRUE(c->DropMovingRows().ok());
        EXPECT_TRUE(testing::StoredRows(*c, "dyn") == before);
      }
    }
    if (crash) {
      auto h = ClusterShard(dir.path, 1, 3);
      auto c = h->Open();
      ASSERT_NE(c, nullptr);
      EXPECT_TRUE(testing::StoredRows(*c, "dyn") == before) << "loaded rows it does not own";
      EXPECT_TRUE(std::any_of(h->log.begin(), h->log.end(), [&](const std::string& line) {
        return absl::StrContains(line, absl::StrCat(moving.ids.size(), " stored rows of ids"));
      })) << "the rows not loaded are not logged";
      ASSERT_TRUE(c->DropMovingRows().ok());
    }
    // What is on disk, opened as the only shard (which owns every id).
    Harness all(dir.path);
    auto c = all.Open();
    ASSERT_NE(c, nullptr);
    EXPECT_TRUE(testing::StoredRows(*c, "dyn") == before) << "rows it does not own on disk";
  }
}

// A checkpoint taken on 3 shards of a cluster restored onto 2: each new shard takes the
// rows it owns now from the 3 shards' checkpoint directories (each row from its owner's,
// not from a stale copy another shard held), serves the same rows (a dynamic and a
// fixed-vocabulary table), holds only its own, and keeps them on disk.
TEST(DurableCollection, ACheckpointOfThreeShardsRestoresOntoTwo) {
  v1::TableConfig dyn = Config("m.dyn", 4, v1::CHECKPOINT, v1::ADAM);
  v1::TableConfig fixed = Config("m.fixed", 4, v1::WRITE_THROUGH);
  fixed.set_vocabulary_size(500);
  const std::vector<int64_t> ids = AllIds();  // [0, 200)
  std::vector<std::string> old_dirs;
  std::vector<float> want_dyn(ids.size() * 4), want_fixed(ids.size() * 4);
  {
    std::vector<ScopedDir> dirs(3);
    std::vector<std::unique_ptr<Harness>> h;
    std::vector<std::unique_ptr<DurableCollection>> shards;
    for (int k = 0; k < 3; ++k) {
      h.push_back(ClusterShard(dirs[k].path, k, 3));
      shards.push_back(h[k]->Open());
      ASSERT_TRUE(shards[k]->CreateTable(dyn).ok());
      ASSERT_TRUE(shards[k]->CreateTable(fixed).ok());
    }
    std::mt19937 rng(5);
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (int step = 1; step <= 6; ++step) {
      for (const v1::TableConfig* c : {&dyn, &fixed}) {
        std::vector<std::vector<int64_t>> part(3);
        for (const int64_t id : ids) part[embedding::ShardOfRow(*c, id, 3)].push_back(id);
        for (int k = 0; k < 3; ++k) {
          std::vector<float> grads(part[k].size() * 4);
          for (float& x : grads) x = g(rng);
          ASSERT_TRUE(shards[k]->PushGradients(c->name(), part[k], grads, step).ok());
        }
      }
    }
    // Shard 2 holds a stale copy of rows shard 0 owns (as a reshard's imports leave while
    // it copies): the restore takes the owner's.
    embedding::RowBlock stale;
    stale.dim = 4;
    stale.state_floats = 8;  // Adam
    for (const int64_t id : ids) {
      if (embedding::ShardOfRow(dyn, id, 3) != 0 || stale.ids.size() == 20) continue;
      const std::vector<float> row(12, 100.0f + static_cast<float>(id));
      stale.Append(id, row.data(), row.data() + 4, 1, 1);
    }
    ASSERT_TRUE(shards[2]->ImportRows("m.dyn", stale).ok());
    for (int k = 0; k < 3; ++k) ASSERT_TRUE(shards[k]->Checkpoint(6, {}, {"m"}).ok());
    for (const v1::TableConfig* c : {&dyn, &fixed}) {
      std::vector<float>& want = c == &dyn ? want_dyn : want_fixed;
      for (size_t i = 0; i < ids.size(); ++i) {
        const auto row =
            Read(*shards[embedding::ShardOfRow(*c, ids[i], 3)], c->name(), {ids[i]}, 4);
        std::copy(row.begin(), row.end(), want.begin() + i * 4);
      }
    }
    for (int k = 0; k < 3; ++k) {
      old_dirs.push_back(shards[k]->CheckpointDir(6, "m"));
      shards[k].reset();
      // The old shards' directories outlive their processes: move them aside.
      const std::string kept = TempDir();
      fs::remove(kept);
      fs::rename(dirs[k].path, kept);
      old_dirs.back().replace(0, dirs[k].path.size(), kept);
    }
  }
  std::vector<ScopedDir> dirs(2);
  for (int round = 0; round < 2; ++round) {  // restored, then reopened from disk
    std::vector<std::unique_ptr<Harness>> h;
    std::vector<std::unique_ptr<DurableCollection>> shards;
    for (int k = 0; k < 2; ++k) {
      h.push_back(ClusterShard(dirs[k].path, k, 2));
      shards.push_back(h[k]->Open());
      if (round == 0) {
        embedding::RestoreOptions o;
        o.model = "m";
        auto info = shards[k]->RestoreFromShards(old_dirs, nullptr, o);
        ASSERT_TRUE(info.ok()) << info.status();
        EXPECT_EQ(info->step, 6);
      }
    }
    int64_t rows = 0;
    for (const v1::TableConfig* c : {&dyn, &fixed}) {
      const std::vector<float>& want = c == &dyn ? want_dyn : want_fixed;
      for (size_t i = 0; i < ids.size(); ++i) {
        const int owner = embedding::ShardOfRow(*c, ids[i], 2);
        ASSERT_EQ(Read(*shards[owner], c->name(), {ids[i]}, 4),
                  std::vector<float>(want.begin() + i * 4, want.begin() + (i + 1) * 4))
            << c->name() << " id " << ids[i] << " round " << round;
      }
      for (int k = 0; k < 2; ++k) {
        ASSERT_TRUE(shards[k]
                        ->ExportRows(c->name(), {},
                                     [&](const embedding::RowBlock& block) {
                                       for (const int64_t id : block.ids) {
                                         EXPECT_EQ(embedding::ShardOfRow(*c, id, 2), k)
                                             << c->name() << " id " << id;
                                         ++rows;
                                       }
                                       return absl::OkStatus();
                                     })
                        .ok());
      }
    }
    EXPECT_EQ(rows, 400) << "round " << round;  // every id of both tables was pushed
  }
  // Directories of different checkpoints are refused before anything changes.
  Harness other(dirs[0].path);
  other.options.cluster_num_shards = 2;
  auto c = other.Open();
  embedding::RestoreOptions o;
  o.model = "m";
  EXPECT_EQ(c->RestoreFromShards({old_dirs[0], "/nonexistent"}, nullptr, o).status().code(),
            absl::StatusCode::kNotFound);
  o.model = "other";
  EXPECT_EQ(c->RestoreFromShards(old_dirs, nullptr, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (const std::string& d : old_dirs) fs::remove_all(fs::path(d).parent_path().parent_path());
}

TEST(DurableCollection, RestoreGoesBackToAChosenOrTheNewestCheckpointWithAttachments) {
  ScopedDir dir;
  Harness h(dir.path);
  auto c = h.Open();
  ASSERT_TRUE(c->CreateTable(Config("t", 4, v1::CHECKPOINT)).ok());
  Train(*c, "t", 4, 0, 5, 4);
  ASSERT_TRUE(c->Checkpoint(5, {{"dense", "five"}}).ok());
  const auto at5 = Read(*c, "t", AllIds(), 4);
  Train(*c, "t", 4, 5, 5, 5);
  ASSERT_TRUE(c->Checkpoint(10, {{"dense", "ten"}}).ok());
  const auto at10 = Read(*c, "t", AllIds(), 4);
  Train(*c, "t", 4, 10, 5, 6);

  embedding::Attachments a;
  auto info = c->Restore(5, &a);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->step, 5);
  EXPECT_EQ(a["dense"], "five");
  EXPECT_EQ(Read(*c, "t", AllIds(), 4), at5);

  info = c->Restore(-1, &a);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->step, 10);
  EXPECT_EQ(a["dense"], "ten");
  EXPECT_EQ(Read(*c, "t", AllIds(), 4), at10);
  const absl::Status missing = c->Restore(7, nullptr).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  // The message lists the steps there are to pick from.
  EXPECT_THAT(std::string(missing.message()),
              ::testing::HasSubstr("its complete checkpoints are of steps 5, 10"));

  // Training goes on after a restore, and a restart comes back to the restored state.
  Train(*c, "t", 4, 10, 2, 7);
  ASSERT_TRUE(c->Checkpoint(12, {}).ok());
  const auto at12 = Read(*c, "t", AllIds(), 4);
  c.reset();
  c = h.Open();
  EXPECT_EQ(Read(*c, "t", AllIds(), 4), at12);
}

TEST(DurableCollection, KeepsOnlyTheNewestCheckpoints) {
  ScopedDir dir;
  Harness h(dir.path);
  h.options.keep_checkpoints = 2;
  auto c = h.Open();
  ASSERT_TRUE(c->CreateTable(Config("t", 4, v1::CHECKPOINT)).ok());
  for (int step = 1; step <= 4; ++step) {
    Train(*c, "t", 4, step, 1, step);
    ASSERT_TRUE(c->Checkpoint(step, {}).ok());
  }
  auto list = c->ListCheckpoints();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].step, 3);
  EXPECT_EQ((*list)[1].step, 4);
  EXPECT_FALSE(fs::exists(c->CheckpointDir(1)));
}

TEST(DurableCollection, CheckpointWithMissingOrTornManifestIsSkippedWithAWarning) {
  ScopedDir dir;
  Harness h(dir.path);
  h.options.keep_checkpoints = 0;
  auto c = h.Open();
  ASSERT_TRUE(c->CreateTable(Config("t", 4, v1::CHECKPOINT)).ok());
  Train(*c, "t", 4, 0, 3, 8);
  ASSERT_TRUE(c->Checkpoint(3, {}).ok());
  const auto at3 = Read(*c, "t", AllIds(), 4);
  Train(*c, "t", 4, 3, 3, 9);
  ASSERT_TRUE(c->Checkpoint(6, {}).ok());
  Train(*c, "t", 4, 6, 3, 10);
  ASSERT_TRUE(c->Checkpoint(9, {}).ok());
  // 9 loses its manifest (a crash before it was written); 6's is torn half-way.
  fs::remove(c->CheckpointDir(9) + "/MANIFEST");
  const std::string m6 = c->CheckpointDir(6) + "/MANIFEST";
  auto text = ReadFile(m6);
  ASSERT_TRUE(text.ok());
  std::ofstream(m6, std::ios::trunc) << text->substr(0, text->size() / 2);

  h.log.clear();
  auto info = c->Restore(-1, nullptr);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->step, 3);
  EXPECT_EQ(Read(*c, "t", AllIds(), 4), at3);
  std::string all_log;
  for (const auto& l : h.log) all_log += l + "\n";
  EXPECT_THAT(all_log, HasSubstr("skipping checkpoint " + c->CheckpointDir(9)));
  EXPECT_THAT(all_log, HasSubstr("no manifest"));
  EXPECT_THAT(all_log, HasSubstr("skipping checkpoint " + c->CheckpointDir(6)));
}

TEST(DurableCollection, CorruptRowValueIsReportedWithTableAndRow) {
  ScopedDir dir;
  Harness h(dir.path);
  {
    auto c = h.Open();
    ASSERT_TRUE(c->CreateTable(Config("users", 4, v1::WRITE_THROUGH)).ok());
    Train(*c, "users", 4, 0, 3, 11);
  }
  // A value damaged before it reached the store (so the store's own block checksums
  // cannot see it): the row checksum must.
  {
    auto store = OpenRocksDbStore(dir.path + "/db", {});
    ASSERT_TRUE(store.ok());
    auto v = (*store)->Get(RowKey(1, 17));
    ASSERT_TRUE(v.ok() && v->has_value());
    std::string bad = **v;
    bad[30] ^= 0x01;
    ASSERT_TRUE((*store)->Write({KvWrite{RowKey(1, 17), bad}}, true).ok());
  }
  auto c = DurableCollection::Open(h.options);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(c.status().message(), HasSubstr("table 'users'"));
  EXPECT_THAT(c.status().message(), HasSubstr("row 17"));
  EXPECT_THAT(c.status().message(), HasSubstr("checksum"));
}

// Pushes one gradient to each of `n` ids (batches of 4096), in order.
void PushEach(embedding::EmbeddingCollection& c, const std::string& table, int dim, int64_t n,
              int64_t step) {
  for (int64_t begin = 0; begin < n; begin += 4096) {
    std::vector<int64_t> ids;
    for (int64_t id = begin; id < std::min(n, begin + 4096); ++id) ids.push_back(id * 7919);
    std::vector<float> grads(ids.size() * dim);
    for (size_t i = 0; i < grads.size(); ++i)
      grads[i] = 0.001f * static_cast<float>(i % 97) - 0.05f;
    ASSERT_TRUE(c.PushGradients(table, ids, grads, step).ok());
  }
}

TEST(DurableCollection, ManyRowsLoadOnAllCoresBitIdenticalAndTrainOnTheSame) {
  // Enough rows for many load batches on every worker, over three shards.
  constexpr int64_t kRows = 30000;
  constexpr int kDim = 8;
  ScopedDir dir;
  Harness h(dir.path, /*shards=*/3);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < kRows; ++i) ids.push_back(i * 7919);
  // The same pushes on a collection that never went to disk.
  auto reference = embedding::NewInProcessCollection(3).value();
  ASSERT_TRUE(reference->CreateTable(Config("many", kDim, v1::WRITE_THROUGH)).ok());
  {
    auto c = h.Open();
    ASSERT_TRUE(c->CreateTable(Config("many", kDim, v1::WRITE_THROUGH)).ok());
    for (int64_t step : {1, 2}) {
      PushEach(*c, "many", kDim, kRows, step);
      PushEach(*reference, "many", kDim, kRows, step);
    }
  }
  auto c = h.Open();
  EXPECT_EQ(c->rows_loaded(), kRows);
  EXPECT_EQ(Read(*c, "many", ids, kDim), Read(*reference, "many", ids, kDim));
  // Adagrad: the next step depends on the accumulators that came back with the rows.
  PushEach(*c, "many", kDim, kRows, 3);
  PushEach(*reference, "many", kDim, kRows, 3);
  EXPECT_EQ(Read(*c, "many", ids, kDim), Read(*reference, "many", ids, kDim));
  bool reported = false;
  for (const std::string& line : h.log) reported |= line.find("rows/s)") != std::string::npos;
  EXPECT_TRUE(reported);
}

TEST(DurableCollection, ACorruptRowAmongManyStopsTheLoadNamingIt) {
  constexpr int64_t kRows = 20000;
  ScopedDir dir;
  Harness h(dir.path, /*shards=*/2);
  {
    auto c = h.Open();
    ASSERT_TRUE(c->CreateTable(Config("many", 4, v1::WRITE_THROUGH)).ok());
    PushEach(*c, "many", 4, kRows, 1);
  }
  const int64_t bad_id = 12345 * 7919;
  {
    auto store = OpenRocksDbStore(dir.path + "/db", {});
    ASSERT_TRUE(store.ok());
    auto v = (*store)->Get(RowKey(1, bad_id));
    ASSERT_TRUE(v.ok() && v->has_value());
    std::string bad = **v;
    bad[30] ^= 0x01;
    ASSERT_TRUE((*store)->Write({KvWrite{RowKey(1, bad_id), bad}}, true).ok());
  }
  auto c = DurableCollection::Open(h.options);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(c.status().message(), HasSubstr(absl::StrCat("row ", bad_id, " is corrupt")));
}

TEST(DurableCollection, ByteFlippedOnDiskIsDetectedOnLoad) {
  ScopedDir dir;
  Harness h(dir.path);
  {
    auto c = h.Open();
    ASSERT_TRUE(c->CreateTable(Config("items", 16, v1::CHECKPOINT)).ok());
    Train(*c, "items", 16, 0, 3, 12);
    ASSERT_TRUE(c->Checkpoint(3, {}).ok());  // flushes the live store into table files
  }
  ASSERT_TRUE(FlipAByteOfARow(dir.path + "/db"));
  auto c = DurableCollection::Open(h.options);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDataLoss) << c.status();
  EXPECT_THAT(c.status().message(), HasSubstr("table 'items': stored rows after row"))
      << c.status();
}

TEST(DurableCollection, DiskErrorOnWriteThroughPushChangesNothing) {
  ScopedDir dir;
  Harness h(dir.path);
  auto c = h.Open();
  ASSERT_TRUE(c->CreateTable(Config("wt", 4, v1::WRITE_THROUGH)).ok());
  Train(*c, "wt", 4, 0, 5, 13);
  const auto before = Read(*c, "wt", AllIds(), 4);
  h.faults.writes = true;
  std::vector<int64_t> ids = {1, 2, 3, 500};  // 500 does not exist yet
  std::vector<float> grads(ids.size() * 4, 0.5f);
  absl::Status s = c->PushGradients("wt", ids, grads, 6);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("not applied"));
  EXPECT_EQ(Read(*c, "wt", AllIds(), 4), before);
  std::vector<float> row500 = Read(*c, "wt", {500}, 4);
  // A failing checkpoint leaves no checkpoint behind.
  EXPECT_FALSE(c->Checkpoint(6, {}).ok());
  h.faults.writes = false;
  auto list = c->ListCheckpoints();
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
  c.reset();
  c = h.Open();
  EXPECT_EQ(Read(*c, "wt", AllIds(), 4), before);
  EXPECT_EQ(Read(*c, "wt", {500}, 4), row500);
}

TEST(DurableCollection, RestartAfterAnInterruptedCheckpointComesBackAsOfThePreviousOne) {
  ScopedDir dir;
  Harness h(dir.path);
  std::vector<float> at5;
  {
    auto c = h.Open();
    ASSERT_TRUE(c->CreateTable(Config("ck", 4, v1::CHECKPOINT)).ok());
    ASSERT_TRUE(c->CreateTable(Config("wt", 4, v1::WRITE_THROUGH)).ok());
    Train(*c, "ck", 4, 0, 5, 20);
    ASSERT_TRUE(c->Checkpoint(5, {}).ok());
    at5 = Read(*c, "ck", AllIds(), 4);
    Train(*c, "ck", 4, 5, 5, 21);
    Train(*c, "wt", 4, 0, 5, 22);
    // The rows of checkpoint 10 reach the live store, then taking the copy fails.
    h.faults.checkpoints = true;
    EXPECT_FALSE(c->Checkpoint(10, {}).ok());
    h.faults.checkpoints = false;
  }
  const auto wt = [&] {
    Harness fresh(TempDir());
    auto r = fresh.Open();
    EXPECT_TRUE(r->CreateTable(Config("wt", 4, v1::WRITE_THROUGH)).ok());
    Train(*r, "wt", 4, 0, 5, 22);
    auto rows = Read(*r, "wt", AllIds(), 4);
    fs::remove_all(fresh.options.data_dir);
    return rows;
  }();
  h.log.clear();
  auto c = h.Open();
  EXPECT_EQ(Read(*c, "ck", AllIds(), 4), at5);  // not the half-taken checkpoint 10
  EXPECT_EQ(Read(*c, "wt", AllIds(), 4), wt);   // write-through rows untouched by recovery
  std::string all_log;
  for (const auto& l : h.log) all_log += l + "\n";
  EXPECT_THAT(all_log, HasSubstr("checkpoint 10 was interrupted"));
}

embedding::CheckpointOptions OfModel(const std::string& model) {
  embedding::CheckpointOptions o;
  o.model = model;
  return o;
}

std::vector<std::string> Names(embedding::EmbeddingCollection& c) {
  std::vector<std::string> names;
  const auto tables = c.ListTables();
  for (const auto& t : *tables) names.push_back(t.name());
  return names;
}

TEST(DurableCollection, AModelsCheckpointAndRestoreTouchOnlyItsTablesAndSurviveAReopen) {
  ScopedDir dir;
  Harness h(dir.path, /*shards=*/2);
  std::vector<float> x5, w5, y_after;
  {
    auto c = h.Open();
    ASSERT_TRUE(c->CreateTable(Config("a.x", 4, v1::CHECKPOINT)).ok());
    ASSERT_TRUE(c->CreateTable(Config("a.w", 4, v1::WRITE_THROUGH)).ok());
    ASSERT_TRUE(c->CreateTable(Config("b.y", 4, v1::CHECKPOINT)).ok());
    for (const char* t : {"a.x", "a.w", "b.y"}) Train(*c, t, 4, 0, 5, 30);
    auto info = c->Checkpoint(5, {{"dense", "a5"}}, OfModel("a"));
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->model, "a");
    x5 = Read(*c, "a.x", AllIds(), 4);
    w5 = Read(*c, "a.w", AllIds(), 4);
    for (const char* t : {"a.x", "a.w", "b.y"}) Train(*c, t, 4, 5, 5, 31);
    y_after = Read(*c, "b.y", AllIds(), 4);
    ASSERT_TRUE(c->CreateTable(Config("a.late", 4, v1::CHECKPOINT)).ok());
    ASSERT_TRUE(c->DropTable("a.w").ok());

    embedding::RestoreOptions restore;
    restore.model = "a";
    embedding::Attachments attachments;
    ASSERT_TRUE(c->Restore(-1, &attachments, restore).ok());
    EXPECT_EQ(attachments["dense"], "a5");
    EXPECT_EQ(Names(*c), (std::vector<std::string>{"a.w", "a.x", "b.y"}));
    EXPECT_EQ(Read(*c, "a.x", AllIds(), 4), x5);
    EXPECT_EQ(Read(*c, "a.w", AllIds(), 4), w5);
    EXPECT_EQ(Read(*c, "b.y", AllIds(), 4), y_after);  // another model: untouched
    // Model b's own checkpoint flushes b's rows only.
    ASSERT_TRUE(c->Checkpoint(6, {}, OfModel("b")).ok());
    // A step a model has a checkpoint of is never written again.
    EXPECT_EQ(c->Checkpoint(5, {}, OfModel("a")).status().code(), absl::StatusCode::kAlreadyExists);
    embedding::CheckpointOptions replace = OfModel("a");
    replace.replace = true;  // what a coordinator asks for a cluster checkpoint never completed
    EXPECT_TRUE(c->Checkpoint(5, {}, replace).ok());
  }
  auto c = h.Open();
  EXPECT_EQ(Names(*c), (std::vector<std::string>{"a.w", "a.x", "b.y"}));
  EXPECT_EQ(Read(*c, "a.x", AllIds(), 4), x5);
  EXPECT_EQ(Read(*c, "a.w", AllIds(), 4), w5);
  EXPECT_EQ(Read(*c, "b.y", AllIds(), 4), y_after);
}

// Issue 41, item 8: a model's checkpoint holds and reports its own rows, not the shard's:
// a 4-row model beside a 20,000-row one checkpoints a store with its table alone, its
// bytes a small part of the big model's, and restores from it.
TEST(DurableCollection, AModelsCheckpointHoldsAndReportsItsOwnRowsOnly) {
  ScopedDir dir;
  Harness h(dir.path);
  auto c = h.Open();
  ASSERT_TRUE(c->CreateTable(Config("small.x", 4, v1::CHECKPOINT)).ok());
  ASSERT_TRUE(c->CreateTable(Config("big.y", 16, v1::CHECKPOINT)).ok());
  const std::vector<int64_t> few = {1, 2, 3, 4};
  ASSERT_TRUE(c->PushGradients("small.x", few, std::vector<float>(few.size() * 4, 0.5f), 1).ok());
  std::vector<int64_t> many(20000);
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<int64_t>(i) * 7919;
  ASSERT_TRUE(c->PushGradients("big.y", many, std::vector<float>(many.size() * 16, 0.25f), 1).ok());
  auto big = c->Checkpoint(1, {}, OfModel("big"));
  ASSERT_TRUE(big.ok()) << big.status();
  auto small = c->Checkpoint(1, {}, OfModel("small"));
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->rows, 4);
  EXPECT_LT(small->bytes * 10, big->bytes) << small->bytes << " bytes against " << big->bytes;
  {
    // What the checkpoint's store holds: the small model's catalog entry and rows alone.
    auto store = OpenRocksDbStore(c->CheckpointDir(1, "small") + "/db", {});
    ASSERT_TRUE(store.ok()) << store.status();
    int64_t rows = 0, entries = 0;
    ASSERT_TRUE((*store)
                    ->Scan("",
                           [&](absl::string_view key, absl::string_view) {
                             rows += key[0] == 'R';
                             entries += key[0] == 'C';
                             return absl::OkStatus();
                           })
                    .ok());
    EXPECT_EQ(rows, 4);
    EXPECT_EQ(entries, 1);
  }
  const auto x1 = Read(*c, "small.x", few, 4);
  ASSERT_TRUE(c->PushGradients("small.x", few, std::vector<float>(few.size() * 4, 1.0f), 2).ok());
  embedding::RestoreOptions restore;
  restore.model = "small";
  ASSERT_TRUE(c->Restore(1, nullptr, restore).ok());
  EXPECT_EQ(Read(*c, "small.x", few, 4), x1);
}

// A model's newest checkpoint with a corrupt table file: its restore reads it whole before
// touching anything, so it fails with every table as it was, the collection serving and
// restartable, and the message names the checkpoint before it, which restores.
TEST(DurableCollection, ACheckpointThatCannotBeReadRestoresNothingAndNamesTheOneBefore) {
  ScopedDir dir;
  Harness h(dir.path);
  auto c = h.Open();
  ASSERT_TRUE(c->CreateTable(Config("a.x", 16, v1::CHECKPOINT)).ok());
  ASSERT_TRUE(c->CreateTable(Config("b.y", 16, v1::CHECKPOINT)).ok());
  for (const char* t : {"a.x", "b.y"}) Train(*c, t, 16, 0, 5, 40);
  ASSERT_TRUE(c->Checkpoint(5, {{"dense", "a5"}}, OfModel("a")).ok());
  const auto x5 = Read(*c, "a.x", AllIds(), 16);
  for (const char* t : {"a.x", "b.y"}) Train(*c, t, 16, 5, 5, 41);
  ASSERT_TRUE(c->Checkpoint(10, {{"dense", "a10"}}, OfModel("a")).ok());
  const auto x10 = Read(*c, "a.x", AllIds(), 16);
  Train(*c, "a.x", 16, 10, 3, 42);
  const auto x_live = Read(*c, "a.x", AllIds(), 16), y_live = Read(*c, "b.y", AllIds(), 16);
  // A row of a.x as checkpoint 10 holds it, one of its bytes flipped in that table file.
  ASSERT_TRUE(FlipAByteOfARow(c->CheckpointDir(10, "a") + "/db"));

  embedding::RestoreOptions restore;
  restore.model = "a";
  const absl::Status s = c->Restore(-1, nullptr, restore).status();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("checkpoint 10 of model 'a'")) << s;
  EXPECT_THAT(s.message(), HasSubstr("nothing was restored")) << s;
  EXPECT_THAT(s.message(), HasSubstr("the newest older complete one here is step 5")) << s;
  EXPECT_THAT(s.message(), Not(HasSubstr("half-way"))) << s;
  // Every model serves as it was, and takes checkpoints.
  EXPECT_EQ(Read(*c, "a.x", AllIds(), 16), x_live);
  EXPECT_EQ(Read(*c, "b.y", AllIds(), 16), y_live);
  EXPECT_TRUE(c->Checkpoint(11, {}, OfModel("b")).ok());
  // Restartable (a CHECKPOINT table comes back as its last flush, at checkpoint 10, left),
  // and the checkpoint before restores.
  c.reset();
  c = h.Open();
  EXPECT_EQ(Read(*c, "a.x", AllIds(), 16), x10);
  embedding::Attachments attachments;
  ASSERT_TRUE(c->Restore(5, &attachments, restore).ok());
  EXPECT_EQ(attachments["dense"], "a5");
  EXPECT_EQ(Read(*c, "a.x", AllIds(), 16), x5);
  EXPECT_EQ(Read(*c, "b.y", AllIds(), 16), y_live);
}

TEST(DurableCollection, AModelRestoreCutShortIsFinishedOnTheNextOpen) {
  ScopedDir dir;
  Harness h(dir.path);
  std::vector<float> at3;
  {
    auto c = h.Open();
    ASSERT_TRUE(c->CreateTable(Config("m.t", 4, v1::CHECKPOINT)).ok());
    Train(*c, "m.t", 4, 0, 3, 40);
    ASSERT_TRUE(c->Checkpoint(3, {}, OfModel("m")).ok());
    at3 = Read(*c, "m.t", AllIds(), 4);
    Train(*c, "m.t", 4, 3, 3, 41);
    ASSERT_TRUE(c->Checkpoint(6, {}, OfModel("m")).ok());
    // A restore of checkpoint 3 that stopped after its marker, before any row moved.
    std::ofstream(dir.path + "/RESTORE-IN-PROGRESS") << c->CheckpointDir(3, "m");
  }
  h.log.clear();
  auto c = h.Open();
  EXPECT_EQ(Read(*c, "m.t", AllIds(), 4), at3);
  EXPECT_FALSE(fs::exists(dir.path + "/RESTORE-IN-PROGRESS"));
  std::string all_log;
  for (const auto& l : h.log) all_log += l + "\n";
  EXPECT_THAT(all_log, HasSubstr("was interrupted; finishing it"));
}

TEST(DurableCollection, RetentionKeepsEachModelsNewestCreatedCheckpoints) {
  ScopedDir dir;
  Harness h(dir.path);
  h.options.keep_checkpoints = 2;
  auto c = h.Open();
  ASSERT_TRUE(c->CreateTable(Config("a.t", 4, v1::CHECKPOINT)).ok());
  ASSERT_TRUE(c->CreateTable(Config("b.t", 4, v1::CHECKPOINT)).ok());
  ASSERT_TRUE(c->Checkpoint(2400, {}, OfModel("a")).ok());
  ASSERT_TRUE(c->Checkpoint(2100, {}, OfModel("a")).ok());
  ASSERT_TRUE(c->Checkpoint(1, {}, OfModel("b")).ok());
  ASSERT_TRUE(c->Checkpoint(5, {}, OfModel("a")).ok());  // the newest of a, lowest step
  std::vector<std::pair<std::string, int64_t>> kept;
  const auto list = c->ListCheckpoints();
  for (const auto& info : *list) kept.emplace_back(info.model, info.step);
  EXPECT_EQ(kept, (std::vector<std::pair<std::string, int64_t>>{{"a", 2100}, {"b", 1}, {"a", 5}}));
  embedding::RestoreOptions a;
  a.model = "a";
  EXPECT_EQ(c->Restore(-1, nullptr, a)->step, 5);
}

TEST(DurableCollection, ADroppedTableIsGoneAfterAReopenAndComesBackFresh) {
  ScopedDir dir;
  Harness h(dir.path);
  {
    auto c = h.Open();
    ASSERT_TRUE(c->CreateTable(Config("t", 4, v1::WRITE_THROUGH)).ok());
    ASSERT_TRUE(c->CreateTable(Config("keep", 4, v1::WRITE_THROUGH)).ok());
    Train(*c, "t", 4, 0, 3, 50);
    Train(*c, "keep", 4, 0, 3, 51);
    ASSERT_TRUE(c->DropTable("t").ok());
    EXPECT_EQ(c->DropTable("t").code(), absl::StatusCode::kNotFound);
  }
  auto c = h.Open();
  EXPECT_EQ(Names(*c), std::vector<std::string>{"keep"});
  ASSERT_TRUE(c->CreateTable(Config("t", 4, v1::WRITE_THROUGH)).ok());
  auto fresh = embedding::NewInProcessCollection(1).value();
  ASSERT_TRUE(fresh->CreateTable(Config("t", 4, v1::WRITE_THROUGH)).ok());
  EXPECT_EQ(Read(*c, "t", AllIds(), 4), Read(*fresh, "t", AllIds(), 4));
}

// AlterTable: the new optimizer settings are used at once, survive a reopen, are held by
// a checkpoint taken after them, and a restore brings back the checkpoint's.
TEST(DurableCollection, AnAlteredOptimizerIsKeptAndCheckpointedWithItsTable) {
  ScopedDir dir;
  Harness h(dir.path);
  const std::vector<int64_t> ids = {1, 2, 3};
  const std::vector<float> ones(ids.size() * 4, 1.0f);
  v1::OptimizerConfig slower;
  slower.set_learning_rate(0.25f);
  {
    auto c = h.Open();
    ASSERT_TRUE(c->CreateTable(Config("t", 4, v1::WRITE_THROUGH, v1::SGD)).ok());  // lr 0.05
    ASSERT_TRUE(c->Checkpoint(1, {}).ok());
    auto altered = c->AlterTable("t", slower);
    ASSERT_TRUE(altered.ok()) << altered.status();
    EXPECT_EQ(altered->optimizer().learning_rate(), 0.25f);
    EXPECT_EQ(c->AlterTable("nope", slower).status().code(), absl::StatusCode::kNotFound);
    v1::OptimizerConfig adam;
    adam.set_type(v1::ADAM);
    EXPECT_EQ(c->AlterTable("t", adam).status().code(), absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE(c->Checkpoint(2, {}).ok());
  }
  auto c = h.Open();  // reopened: the catalog holds the altered config
  ASSERT_EQ(c->ListTables()->at(0).optimizer().learning_rate(), 0.25f);
  const auto before = Read(*c, "t", ids, 4);
  ASSERT_TRUE(c->PushGradients("t", ids, ones, 3).ok());
  auto after = Read(*c, "t", ids, 4);
  for (size_t i = 0; i < after.size(); ++i) EXPECT_FLOAT_EQ(after[i], before[i] - 0.25f);
  // Checkpoint 1 was taken before the alter: its config comes back with it.
  ASSERT_TRUE(c->Restore(1, nullptr).ok());
  EXPECT_EQ(c->ListTables()->at(0).optimizer().learning_rate(), 0.05f);
  ASSERT_TRUE(c->Restore(2, nullptr).ok());
  EXPECT_EQ(c->ListTables()->at(0).optimizer().learning_rate(), 0.25f);
}

TEST(DurableCollection, UnwritableDataDirectoryFailsAtStartUp) {
  ScopedDir dir;
  const std::string file = dir.path + "/not-a-dir";
  std::ofstream(file) << "x";
  DurableOptions o;
  o.data_dir = file;
  auto c = DurableCollection::Open(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(c.status().message(), HasSubstr(file));
  if (::geteuid() != 0) {  // permissions do not stop root
    const std::string ro = dir.path + "/ro";
    fs::create_directories(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    o.data_dir = ro;
    c = DurableCollection::Open(o);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(c.status().message(), HasSubstr("not writable"));
    fs::permissions(ro, fs::perms::owner_all);
  }
}

// A table with a budget of 400 rows trained over 3000 ids: lookups of every id must equal
// a reference table that holds everything in memory, bit for bit.
void ExpectLargerThanMemory(v1::Durability durability, v1::Dtype dtype = v1::FP32) {
  ScopedDir dir;
  Harness h(dir.path, /*shards=*/2);
  v1::TableConfig config = Config("big", 4, durability);
  config.set_max_rows(400);
  config.set_dtype(dtype);
  config.mutable_eviction()->set_policy(v1::EVICTION_LRU);
  v1::TableConfig unlimited = Config("big", 4, durability);
  unlimited.set_dtype(dtype);
  auto reference = embedding::EmbeddingTable::Create(unlimited).value();
  std::vector<int64_t> all(3000);
  for (int i = 0; i < 3000; ++i) all[i] = i;
  auto expected = [&] {
    std::vector<float> out(all.size() * 4);
    EXPECT_TRUE(reference->Lookup(all, out.data(), false).ok());
    return out;
  };
  auto train = [&](embedding::EmbeddingCollection& c, int from, int to) {
    testing::RandomPushes pushes(from, 50, 3000, 4);
    std::vector<int64_t> ids;
    std::vector<float> grads;
    for (int step = from; step < to; ++step) {
      pushes.Next(&ids, &grads);
      ASSERT_TRUE(c.PushGradients("big", ids, grads, step).ok());
      ASSERT_TRUE(reference->PushGradients(ids, grads.data(), step).ok());
    }
  };
  std::vector<float> at_checkpoint;
  {
    auto c = h.Open();
    ASSERT_TRUE(c->CreateTable(config).ok());
    train(*c, 0, 100);
    auto usage = c->Usage("big");
    ASSERT_TRUE(usage.ok());
    EXPECT_LE(usage->rows, 400);  // hot rows in memory ...
    std::vector<float> out(all.size() * 4);
    embedding::LookupOptions read_only;
    read_only.insert_missing = false;
    ASSERT_TRUE(c->Lookup("big", all, absl::MakeSpan(out), read_only).ok());
    EXPECT_EQ(out, expected());  // ... cold rows on disk, every one exact
    ASSERT_TRUE(c->Checkpoint(100, {}).ok());
    at_checkpoint = expected();
    train(*c, 100, 130);
    EXPECT_EQ(Read(*c, "big", all, 4), expected());
  }
  auto c = h.Open();
  std::vector<float> out(all.size() * 4);
  embedding::LookupOptions read_only;
  read_only.insert_missing = false;
  ASSERT_TRUE(c->Lookup("big", all, absl::MakeSpan(out), read_only).ok());
  if (durability == v1::WRITE_THROUGH) {
    EXPECT_EQ(out, expected());  // every acknowledged push
  } else {
    EXPECT_EQ(out, at_checkpoint);  // as of the checkpoint, evictions since included or not
  }
  auto usage = c->Usage("big");
  ASSERT_TRUE(usage.ok());
  EXPECT_LE(usage->rows, 400);
}

TEST(DurableCollection, CheckpointTableLargerThanMemoryKeepsColdRowsOnDisk) {
  ExpectLargerThanMemory(v1::CHECKPOINT);
}

TEST(DurableCollection, WriteThroughTableLargerThanMemoryKeepsColdRowsOnDisk) {
  ExpectLargerThanMemory(v1::WRITE_THROUGH);
}

TEST(DurableCollection, HalfPrecisionTableLargerThanMemoryKeepsColdRowsOnDisk) {
  ExpectLargerThanMemory(v1::CHECKPOINT, v1::BF16);
  ExpectLargerThanMemory(v1::WRITE_THROUGH, v1::FP16);
}

// Checkpointed (bf16, three shards: the flush copies the widened weights it is lent) and
// write-through (fp16) half-precision tables come back bit for bit, optimizer state too.
TEST(DurableCollection, HalfPrecisionTablesComeBackBitIdentical) {
  for (const auto& [durability, dtype] :
       {std::pair{v1::CHECKPOINT, v1::BF16}, std::pair{v1::WRITE_THROUGH, v1::FP16}}) {
    ScopedDir dir;
    Harness h(dir.path, /*shards=*/3);
    v1::TableConfig config = Config("half", 8, durability, v1::ADAM);
    config.set_dtype(dtype);
    std::vector<float> expected;
    {
      auto c = h.Open();
      ASSERT_TRUE(c->CreateTable(config).ok());
      Train(*c, "half", 8, 0, 12, 4);
      if (durability == v1::CHECKPOINT) {
        ASSERT_TRUE(c->Checkpoint(12, {}).ok());
      }
      expected = Read(*c, "half", AllIds(), 8);
    }
    auto c = h.Open();
    auto tables = c->ListTables();
    ASSERT_TRUE(tables.ok());
    EXPECT_EQ((*tables)[0].dtype(), dtype);
    EXPECT_EQ(Read(*c, "half", AllIds(), 8), expected);
    ScopedDir fresh;
    Harness h2(fresh.path);
    auto reference = h2.Open();
    ASSERT_TRUE(reference->CreateTable(config).ok());
    Train(*reference, "half", 8, 0, 12, 4);
    Train(*reference, "half", 8, 12, 2, 5);
    Train(*c, "half", 8, 12, 2, 5);
    EXPECT_EQ(Read(*c, "half", AllIds(), 8), Read(*reference, "half", AllIds(), 8));
  }
}

TEST(DurableCollection, RejectsDuplicateTablesAndBadAttachmentNames) {
  ScopedDir dir;
  Harness h(dir.path);
  auto c = h.Open();
  ASSERT_TRUE(c->CreateTable(Config("t", 4, v1::CHECKPOINT)).ok());
  EXPECT_EQ(c->CreateTable(Config("t", 4, v1::CHECKPOINT)).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(c->Checkpoint(1, {{"../escape", "x"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Checkpoint(-1, {}).status().code(), absl::StatusCode::kInvalidArgument);
  c.reset();
  c = h.Open();
  auto tables = c->ListTables();
  ASSERT_TRUE(tables.ok());
  EXPECT_EQ(tables->size(), 1u);
}

}  // namespace
}  // namespace tessera::storage
