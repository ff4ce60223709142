// A cluster shared by several jobs (2 durable shards and a durable coordinator on
// 127.0.0.1): models' tables and checkpoints that cannot hurt each other, checkpoints kept
// by creation and never overwritten, dropped tables, restores that leave no zombie, and
// the Kubernetes training Job's own flow.

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/embedding_client.h"
#include "embedding/inprocess_collection.h"
#include "embedding/storage/checkpoint_manifest.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/shard_process.h"
#include "tests/support/table_configs.h"
#include "tests/support/temp_dir.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::DurableCluster;

const std::string& ScratchDir() { return testing::ProcessScratchDir(); }

struct Result {
  int exit_code = -1;
  std::string output;
};

Result RunBinary(const std::string& binary, const std::string& args) {
  Result r;
  FILE* p = popen(absl::StrCat(binary, " ", args, " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

v1::TableConfig Table(const std::string& name) {
  return testing::TestTable(name, 4, 11, v1::SGD, 0.5f);
}

class SharedClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(ScratchDir(), "/",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
    cluster_ = std::make_unique<DurableCluster>(2, root_);
    ASSERT_TRUE(cluster_->Start());
    client::ClientOptions o;
    o.mode = client::ClientOptions::Mode::kSmart;
    auto c = client::EmbeddingClient::Connect(address(), o);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
  }
  void TearDown() override {
    client_.reset();
    if (cluster_) cluster_->KillAll();
    std::filesystem::remove_all(root_);
  }
  const std::string& address() const { return cluster_->coordinator->address(); }

  std::vector<float> Rows(const std::string& table, const std::vector<int64_t>& ids,
                          int dim = 4) {
    std::vector<float> out(ids.size() * dim);
    embedding::LookupOptions read_only;
    read_only.insert_missing = false;
    absl::Status s = client_->Lookup(table, ids, absl::MakeSpan(out), read_only);
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }
  void Push(const std::string& table, const std::vector<int64_t>& ids, float g, int64_t step) {
    std::vector<float> grads(ids.size() * 4, g);
    ASSERT_TRUE(client_->PushGradients(table, ids, grads, step).ok());
  }
  std::vector<std::string> Names() {
    std::vector<std::string> names;
    const auto tables = client_->ListTables();
    EXPECT_TRUE(tables.ok()) << tables.status();
    if (tables.ok()) {
      for (const auto& t : *tables) names.push_back(t.name());
    }
    return names;
  }
  Result Cli(const std::string& args) {
    return RunBinary(TESSERA_CLI_BIN, absl::StrCat("--coordinator=", address(), " ", args));
  }
  // tessera-cli with `args` fails (exit code 1), saying `says`.
  void ExpectCliRefuses(const std::string& args, const std::string& says) {
    Result r = Cli(args);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_THAT(r.output, HasSubstr(says)) << args;
  }

  std::string root_;
  std::unique_ptr<DurableCluster> cluster_;
  std::unique_ptr<client::EmbeddingClient> client_;
  const std::vector<int64_t> ids_ = {1, 2, 3, 40, 500, -6};
};

// Items 3 and 4: a checkpoint of a lower step taken later is the newest (retention keeps
// it), and a step that exists is refused, never overwritten.
TEST_F(SharedClusterTest, RetentionKeepsTheNewestCreatedAndAStepIsNeverOverwritten) {
  ASSERT_TRUE(client_->CreateTable(Table("job.t")).ok());
  for (int64_t step : {1800, 2100, 2400}) {
    Push("job.t", ids_, 0.1f, step);
    ASSERT_TRUE(client_->Checkpoint(step, {{"dense", absl::StrCat("dense-", step)}}).ok());
  }
  Push("job.t", ids_, 0.1f, 2500);
  Result taken = Cli("checkpoint --step=5");
  ASSERT_EQ(taken.exit_code, 0) << taken.output;
  std::vector<int64_t> steps;
  const auto listed = client_->ListCheckpoints();  // held: .value() of a temporary dangles
  ASSERT_TRUE(listed.ok()) << listed.status();
  for (const auto& c : *listed) steps.push_back(c.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{2100, 2400, 5}));  // oldest created first, 3 kept
  const std::vector<float> at5 = Rows("job.t", ids_);

  ExpectCliRefuses("checkpoint --step=2400", "ALREADY_EXISTS");
  embedding::Attachments attachments;
  embedding::RestoreOptions whole_cluster;
  whole_cluster.all_models = true;
  auto restored = client_->Restore(2400, &attachments, whole_cluster);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(attachments["dense"], "dense-2400");  // the original, dense state and all
  EXPECT_NE(Rows("job.t", ids_), at5);
  // The newest (step 5) is what -1 restores.
  ASSERT_TRUE(client_->Restore(-1, nullptr, whole_cluster).ok());
  EXPECT_EQ(Rows("job.t", ids_), at5);
}

// A model's checkpoint holds its tables only; restoring it leaves other models' tables
// alone, drops its tables created since and brings back its dropped ones.
TEST_F(SharedClusterTest, AModelsRestoreTouchesOnlyItsOwnTables) {
  for (const char* name : {"ads.user", "ads.item", "feed.user"}) {
    ASSERT_TRUE(client_->CreateTable(Table(name)).ok());
    Push(name, ids_, 0.1f, 1);
  }
  embedding::CheckpointOptions ads;
  ads.model = "ads";
  auto taken = client_->Checkpoint(7, {{"dense", "ads-7"}}, ads);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->model, "ads");
  const auto user7 = Rows("ads.user", ids_), item7 = Rows("ads.item", ids_);
  Push("ads.user", ids_, 1.0f, 8);
  Push("feed.user", ids_, 1.0f, 8);
  const auto feed8 = Rows("feed.user", ids_);
  ASSERT_TRUE(client_->CreateTable(Table("ads.late")).ok());
  ASSERT_TRUE(client_->DropTable("ads.item").ok());

  embedding::RestoreOptions restore;
  restore.model = "ads";
  embedding::Attachments attachments;
  auto restored = client_->Restore(-1, &attachments, restore);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->step, 7);
  EXPECT_EQ(attachments["dense"], "ads-7");
  EXPECT_EQ(Rows("ads.user", ids_), user7);
  EXPECT_EQ(Rows("ads.item", ids_), item7);   // back from the checkpoint
  EXPECT_EQ(Rows("feed.user", ids_), feed8);  // another model's rows: untouched
  EXPECT_EQ(Names(), (std::vector<std::string>{"ads.item", "ads.user", "feed.user"}));
  EXPECT_TRUE(client_->CreateTable(Table("ads.late")).ok());  // gone cleanly, so it can be again
  EXPECT_EQ(Cli("stats").exit_code, 0);

  // A restore that fails its checks changes nothing.
  Push("ads.user", ids_, 1.0f, 9);
  const auto user9 = Rows("ads.user", ids_);
  restore.required_attachments = {"optimizer-state"};
  auto refused = client_->Restore(-1, nullptr, restore);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_EQ(Rows("ads.user", ids_), user9);
}

// Item 6: a whole-cluster restore of a checkpoint older than a table leaves no zombie.
TEST_F(SharedClusterTest, RestoringAnOlderCheckpointLeavesNoZombieTable) {
  ASSERT_TRUE(client_->CreateTable(Table("old.t")).ok());
  ASSERT_TRUE(client_->Checkpoint(1, {}).ok());
  ASSERT_TRUE(client_->CreateTable(Table("new.t")).ok());
  Push("new.t", ids_, 0.5f, 2);
  Result restored = Cli("restore --step=1 --all_models");
  ASSERT_EQ(restored.exit_code, 0) << restored.output;
  EXPECT_THAT(restored.output, HasSubstr("rolled back (1): old.t"));
  EXPECT_THAT(restored.output, HasSubstr("dropped (1): new.t"));
  EXPECT_EQ(Names(), std::vector<std::string>{"old.t"});
  Result stats = Cli("stats");
  EXPECT_EQ(stats.exit_code, 0) << stats.output;
  ASSERT_TRUE(client_->CreateTable(Table("new.t")).ok());
  // Created anew: its rows are initial again, not the pushed ones.
  auto fresh = embedding::NewInProcessCollection(1).value();
  ASSERT_TRUE(fresh->CreateTable(Table("new.t")).ok());
  std::vector<float> initial(ids_.size() * 4);
  ASSERT_TRUE(fresh->Lookup("new.t", ids_, absl::MakeSpan(initial), {}).ok());
  EXPECT_EQ(Rows("new.t", ids_), initial);
}

// Issue 25, item 6: one command without a model must not roll back every job of a shared
// cluster; a restore says what it rolled back, brought back and dropped.
TEST_F(SharedClusterTest, ARestoreOfEveryModelMustBeAskedForAndSaysWhatItDid) {
  for (const char* name : {"ads.user", "ads.item", "feed.user"}) {
    ASSERT_TRUE(client_->CreateTable(Table(name)).ok());
    Push(name, ids_, 0.1f, 1);
  }
  ASSERT_TRUE(client_->Checkpoint(1, {}).ok());
  embedding::CheckpointOptions ads;
  ads.model = "ads";
  ASSERT_TRUE(client_->Checkpoint(2, {}, ads).ok());
  Push("ads.user", ids_, 1.0f, 3);
  Push("feed.user", ids_, 1.0f, 3);
  ASSERT_TRUE(client_->CreateTable(Table("ads.late")).ok());
  ASSERT_TRUE(client_->DropTable("ads.item").ok());
  const auto ads3 = Rows("ads.user", ids_), feed3 = Rows("feed.user", ids_);

  ExpectCliRefuses("restore", "restore needs --model=NAME");
  // The coordinator refuses it too, naming the models it would roll back.
  auto refused = client_->Restore(1, nullptr);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("2 models: ads, feed"));
  EXPECT_EQ(Rows("ads.user", ids_), ads3);
  EXPECT_EQ(Rows("feed.user", ids_), feed3);
  EXPECT_EQ(Names(), (std::vector<std::string>{"ads.late", "ads.user", "feed.user"}));

  Result restored = Cli("restore --model=ads");
  ASSERT_EQ(restored.exit_code, 0) << restored.output;
  EXPECT_THAT(restored.output, HasSubstr("restored: model ads step 2"));
  EXPECT_THAT(restored.output, HasSubstr("rolled back (1): ads.user"));
  EXPECT_THAT(restored.output, HasSubstr("brought back (1): ads.item"));
  EXPECT_THAT(restored.output, HasSubstr("dropped (1): ads.late"));
  EXPECT_EQ(Rows("feed.user", ids_), feed3);
  EXPECT_EQ(Names(), (std::vector<std::string>{"ads.item", "ads.user", "feed.user"}));
}

// Item 3: an existing table's optimizer settings change on every shard with one call (the
// CLI's alter), are used by the next pushes, survive the servers' restart and go back with
// a checkpoint taken before them.
TEST_F(SharedClusterTest, AlterChangesATablesOptimizerEverywhereAndIsCheckpointed) {
  ASSERT_TRUE(client_->CreateTable(Table("alt.t")).ok());  // SGD, learning rate 0.5
  ASSERT_TRUE(client_->Checkpoint(1, {}).ok());
  ExpectCliRefuses("alter --table=alt.t", "at least one optimizer setting");
  ExpectCliRefuses("alter --table=alt.t --optimizer=adam",
                   "alter cannot change a table's optimizer type");
  // A setting the table's type ignores is refused, naming it and what the type takes.
  ExpectCliRefuses("alter --table=alt.t --lr=0.2 --beta1=0.5",
                   "alter: --beta1 does nothing with optimizer sgd, which "
                   "takes --lr, --clip_norm, --clip_value, --weight_decay");
  ExpectCliRefuses("create --table=alt.u --dim=4 --optimizer=sgd --beta1=0.5 --l1=1",
                   "create: --beta1, --l1 do nothing with optimizer sgd");
  ExpectCliRefuses("create --table=alt.u --dim=4 --optimizer=adam --beta1=0.5 --l1=1",
                   "--l1 does nothing with optimizer adam, which takes --lr, "
                   "--epsilon, --beta1, --beta2, --clip_norm");
  Result alter = Cli("alter --table=alt.t --lr=0.125 --clip_value=100");
  ASSERT_EQ(alter.exit_code, 0) << alter.output;
  EXPECT_THAT(alter.output, HasSubstr("learning_rate: 0.125"));
  Result type = Cli("alter --table=alt.t --lr=0.1 --optimizer=adam");
  EXPECT_EQ(type.exit_code, 0) << type.output;  // --optimizer is create's: alter ignores it
  const auto before = Rows("alt.t", ids_);
  Push("alt.t", ids_, 1.0f, 2);
  auto after = Rows("alt.t", ids_);
  for (size_t i = 0; i < after.size(); ++i) EXPECT_FLOAT_EQ(after[i], before[i] - 0.1f) << i;
  // Every server restarts on its data directory: the settings stay.
  client_.reset();
  cluster_->KillAll();
  ASSERT_TRUE(cluster_->Start());
  client_ = client::EmbeddingClient::Connect(address(), {}).value();
  ASSERT_EQ(client_->ListTables().value().at(0).optimizer().learning_rate(), 0.1f);
  const auto restarted = Rows("alt.t", ids_);
  Push("alt.t", ids_, 1.0f, 3);
  after = Rows("alt.t", ids_);
  for (size_t i = 0; i < after.size(); ++i) EXPECT_FLOAT_EQ(after[i], restarted[i] - 0.1f) << i;
  // Checkpoint 1 holds the table as created.
  ASSERT_EQ(Cli("restore --all_models --step=1").exit_code, 0);
  EXPECT_EQ(client_->ListTables().value().at(0).optimizer().learning_rate(), 0.5f);
  EXPECT_EQ(Cli("alter --table=nope --lr=1").exit_code, 1);
}

// Item 7: a checkpoint of a model with no tables is NOT_FOUND and is not listed.
TEST_F(SharedClusterTest, ACheckpointOfAModelWithoutTablesIsNotFound) {
  ASSERT_TRUE(client_->CreateTable(Table("ads.user")).ok());
  ExpectCliRefuses("checkpoint --model=nosuch --step=4", "NOT_FOUND: model 'nosuch' has no tables");
  embedding::CheckpointOptions other;
  other.model = "ad";  // a prefix of "ads" is another model
  EXPECT_EQ(client_->Checkpoint(4, {}, other).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(client_->ListCheckpoints().value().empty());
}

TEST_F(SharedClusterTest, DropTableRemovesItsRowsEverywhereAndForGood) {
  ASSERT_TRUE(client_->CreateTable(Table("gone.t")).ok());
  Push("gone.t", ids_, 0.5f, 1);
  Result dropped = Cli("drop --model=gone");
  ASSERT_EQ(dropped.exit_code, 0) << dropped.output;
  EXPECT_THAT(dropped.output, HasSubstr("dropped table 'gone.t'"));
  EXPECT_TRUE(Names().empty());
  EXPECT_EQ(client_->DropTable("gone.t").code(), absl::StatusCode::kNotFound);
  std::vector<float> out(ids_.size() * 4);
  EXPECT_EQ(client_->Lookup("gone.t", ids_, absl::MakeSpan(out), {}).code(),
            absl::StatusCode::kNotFound);
  // Every server restarts on its data directory: the table stays dropped.
  client_.reset();
  cluster_->KillAll();
  ASSERT_TRUE(cluster_->Start());
  client_ = client::EmbeddingClient::Connect(address(), {}).value();
  EXPECT_TRUE(Names().empty());
  Result stats = Cli("stats");  // every shard's own tables: none
  EXPECT_EQ(stats.exit_code, 0) << stats.output;
  EXPECT_THAT(stats.output, ::testing::Not(HasSubstr("gone.t")));
}

// Item 5: a resume whose checkpoint fails its checks restores nothing, other jobs' tables
// included; the message says what to do.
TEST_F(SharedClusterTest, AResumeThatFailsItsChecksRestoresNothing) {
  const std::string train = absl::StrCat("--coordinator=", address(),
                                         " --steps=20 --log_every=0 --held_out=500 --model=m");
  Result first = RunBinary(TESSERA_TRAIN_BIN, absl::StrCat(train, " --checkpoint_every=10"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ASSERT_TRUE(client_->CreateTable(Table("other.t")).ok());
  ASSERT_TRUE(client_->Checkpoint(1, {}).ok());  // an operator's checkpoint of everything
  Push("other.t", ids_, 1.0f, 2);
  // An operator's checkpoint of model m: newer than the trainer's, without dense state.
  Result operator_checkpoint = Cli("checkpoint --model=m --step=25");
  ASSERT_EQ(operator_checkpoint.exit_code, 0) << operator_checkpoint.output;
  const auto other = Rows("other.t", ids_), c1 = Rows("m.C1", ids_, 16);
  Result resumed = RunBinary(TESSERA_TRAIN_BIN, absl::StrCat(train, " --steps=40 --resume"));
  EXPECT_EQ(resumed.exit_code, 1) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("holds no 'dense' attachment; nothing was restored"));
  EXPECT_EQ(Rows("other.t", ids_), other);
  EXPECT_EQ(Rows("m.C1", ids_, 16), c1);
}

// A shard missing a model's newest checkpoint (lost, or never written): a restore of it is
// refused before any shard changes, naming the one before; --resume=auto trains on from
// the one before, saying so, instead of advising to drop the model's tables.
TEST_F(SharedClusterTest,
       AShardMissingTheNewestCheckpointChangesNoShardAndResumeTakesTheOneBefore) {
  const std::string train = absl::StrCat("--coordinator=", address(),
                                         " --log_every=0 --held_out=500 --model=m");
  Result first =
      RunBinary(TESSERA_TRAIN_BIN, absl::StrCat(train, " --steps=30 --checkpoint_every=10"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // Shard 1 lost the newest, shard 0 the one before: step 10 is the newest both read.
  for (const auto& [shard, step] : {std::pair{1, 30}, std::pair{0, 20}}) {
    const std::string lost = absl::StrCat(root_, "/shard-", shard, "/checkpoints/",
                                          storage::CheckpointDirName("m", step));
    ASSERT_TRUE(std::filesystem::exists(lost)) << lost;
    std::filesystem::remove_all(lost);
  }
  // Rows after the checkpoints, which a restore would undo.
  ASSERT_TRUE(
      client_->PushGradients("m.C1", ids_, std::vector<float>(ids_.size() * 16, 1.0f), 31).ok());
  const auto c1 = Rows("m.C1", ids_, 16);
  Result restore = Cli("restore --model=m");
  EXPECT_NE(restore.exit_code, 0) << restore.output;
  EXPECT_THAT(restore.output, HasSubstr("no shard changed")) << restore.output;
  EXPECT_THAT(restore.output, HasSubstr("the newest older checkpoint of the model that every "
                                        "shard reads is step 10: tessera-cli restore --model=m "
                                        "--step=10; step(s) 20 do not read on every shard"))
      << restore.output;
  EXPECT_EQ(Rows("m.C1", ids_, 16), c1) << "a shard was restored";
  Result resumed = RunBinary(TESSERA_TRAIN_BIN, absl::StrCat(train, " --steps=40 --resume=auto"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("checkpoint 30 of model 'm' cannot be restored"));
  EXPECT_THAT(resumed.output, HasSubstr("resume: restored checkpoint 10 of model 'm'"));
  EXPECT_THAT(resumed.output, Not(HasSubstr("drop the model's tables")));
}

// Issue 25, items 3 and 4: a resumed run with another learning rate, and a resume of
// trained tables that have no checkpoint, are refused naming why; nothing is trained.
TEST_F(SharedClusterTest, AResumeWithOtherSettingsOrOfTrainedTablesWithoutACheckpointIsRefused) {
  const std::string train = absl::StrCat("--coordinator=", address(),
                                         " --steps=20 --log_every=0 --held_out=500");
  Result first =
      RunBinary(TESSERA_TRAIN_BIN, absl::StrCat(train, " --model=lr --checkpoint_every=10"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto c1 = Rows("lr.C1", ids_, 16);
  Result changed = RunBinary(TESSERA_TRAIN_BIN,
                             absl::StrCat(train, " --model=lr --steps=40 --resume=auto --lr=0.5"));
  EXPECT_EQ(changed.exit_code, 1) << changed.output;
  EXPECT_THAT(changed.output, HasSubstr("exists with another config than this run's: "
                                        "optimizer.learning_rate 0.05 (the table's) vs 0.5"));
  EXPECT_EQ(Rows("lr.C1", ids_, 16), c1);
  EXPECT_THAT(changed.output, HasSubstr("Pass --alter_tables"));
  // Asked for, the run gives the tables its learning rate, and the registry keeps it.
  Result altered = RunBinary(
      TESSERA_TRAIN_BIN, absl::StrCat(train, " --model=lr --steps=40 --resume=auto --lr=0.5 "
                                             "--alter_tables"));
  ASSERT_EQ(altered.exit_code, 0) << altered.output;
  EXPECT_THAT(altered.output, HasSubstr("the learning rate of 26 table(s) is now 0.5"));
  const auto listed = client_->ListTables();
  ASSERT_TRUE(listed.ok()) << listed.status();
  for (const auto& t : *listed) {
    if (absl::StartsWith(t.name(), "lr.")) {
      EXPECT_EQ(t.optimizer().learning_rate(), 0.5f) << t.name();
    }
  }

  // A run that ends without a checkpoint leaves trained tables; resuming them would pair
  // them with a new dense network.
  Result uncheckpointed = RunBinary(TESSERA_TRAIN_BIN, absl::StrCat(train, " --model=nock"));
  ASSERT_EQ(uncheckpointed.exit_code, 0) << uncheckpointed.output;
  const auto nock = Rows("nock.C1", ids_, 16);
  Result resumed = RunBinary(TESSERA_TRAIN_BIN, absl::StrCat(train, " --model=nock --resume=auto"));
  EXPECT_EQ(resumed.exit_code, 1) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("model 'nock' has no complete checkpoint, but its tables "
                                        "hold trained rows: nock.C1 ("));
  EXPECT_THAT(resumed.output, HasSubstr("tessera-cli drop --model=nock"));
  EXPECT_EQ(Rows("nock.C1", ids_, 16), nock);
  // Dropped as the refusal says, the model starts over.
  ASSERT_EQ(Cli("drop --model=nock").exit_code, 0);
  Result fresh = RunBinary(TESSERA_TRAIN_BIN, absl::StrCat(train, " --model=nock --resume=auto"));
  EXPECT_EQ(fresh.exit_code, 0) << fresh.output;
  EXPECT_THAT(fresh.output, HasSubstr("its tables are untouched; starting at step 0"));
}

// Item 8: the Kubernetes training Job: its init container applies the ConfigMap's tables,
// then tessera-train runs with the Job's flags; a restarted pod resumes.
TEST_F(SharedClusterTest, TheKubernetesTrainingJobRunsAndARestartedPodResumes) {
  std::ifstream in(std::string(TESSERA_SOURCE_DIR) + "/deploy/k8s/configmap-tables.yaml");
  std::string json;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (absl::StrContains(line, "tables.json: |")) {
      inside = true;
      continue;
    }
    if (inside) absl::StrAppend(&json, line, "\n");
  }
  ASSERT_FALSE(json.empty());
  const std::string tables = absl::StrCat(root_, "/tables.json");
  std::ofstream(tables) << json;
  Result applied = Cli(absl::StrCat("--tables_file=", tables, " apply"));
  ASSERT_EQ(applied.exit_code, 0) << applied.output;

  // The Job's container arguments, from the manifest, with a short run; its pods (one per
  // completion index) get their index and the pod IP as Kubernetes would substitute them.
  std::ifstream job(std::string(TESSERA_SOURCE_DIR) + "/deploy/k8s/train-job.yaml");
  std::string flags;
  int pods = 1;
  for (std::string line; std::getline(job, line);) {
    absl::string_view l = absl::StripAsciiWhitespace(line);
    if (absl::ConsumePrefix(&l, "completions: ")) {
      ASSERT_TRUE(absl::SimpleAtoi(l, &pods));
    }
    if (!absl::ConsumePrefix(&l, "- --")) continue;
    if (absl::StartsWith(l, "coordinator=") || absl::StartsWith(l, "steps=") ||
        absl::StartsWith(l, "tables_file=") || absl::StartsWith(l, "checkpoint_every=")) {
      continue;
    }
    absl::StrAppend(&flags, " --", l);
  }
  ASSERT_THAT(flags, HasSubstr("--resume=auto"));
  ASSERT_THAT(flags, HasSubstr(absl::StrCat("--num_workers=", pods)));
  const std::string run = absl::StrCat("--coordinator=", address(), flags,
                                       " --steps=30 --checkpoint_every=10 --log_every=0 "
                                       "--held_out=500");
  // Every pod of the Job at once, with `extra` flags; their results by index.
  auto run_pods = [&](const std::string& extra) {
    std::vector<Result> results(pods);
    std::vector<std::thread> threads;
    for (int i = 0; i < pods; ++i) {
      threads.emplace_back([&, i] {
        results[i] = RunBinary(
            TESSERA_TRAIN_BIN,
            absl::StrReplaceAll(absl::StrCat(run, extra), {{"$(WORKER_INDEX)", absl::StrCat(i)},
                                                           {"$(POD_IP)", "127.0.0.1"}}));
      });
    }
    for (auto& t : threads) t.join();
    return results;
  };
  std::vector<Result> first = run_pods("");
  for (int i = 0; i < pods; ++i) {
    ASSERT_EQ(first[i].exit_code, 0) << flags << "\npod " << i << ":\n" << first[i].output;
  }
  // The pods restart (all of them: a failed worker fails the others) and go on.
  std::vector<Result> restarted = run_pods(" --steps=40");
  for (int i = 0; i < pods; ++i) {
    ASSERT_EQ(restarted[i].exit_code, 0) << "pod " << i << ":\n" << restarted[i].output;
  }
  EXPECT_THAT(restarted[0].output, HasSubstr("resume: restored checkpoint 30"));
  for (int i = 1; i < pods; ++i) {
    EXPECT_THAT(restarted[i].output, HasSubstr("resume: took checkpoint 30"));
  }
}

// Export round trip: a table exported (with optimizer state), dropped, created again and
// imported serves the same rows, and trains on exactly as the original would; an export
// since a step holds only the rows updated since.
TEST_F(SharedClusterTest, AnExportedDroppedRecreatedAndImportedTableServesTheSameRows) {
  v1::TableConfig config = Table("serve.t");
  config.mutable_optimizer()->set_type(v1::ADAGRAD);
  ASSERT_TRUE(client_->CreateTable(config).ok());
  auto reference = embedding::NewInProcessCollection(3).value();
  ASSERT_TRUE(reference->CreateTable(config).ok());
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 3000; ++i) ids.push_back(i * 7919 - 5000);
  auto push = [&](embedding::EmbeddingCollection& c, const std::vector<int64_t>& which,
                  int64_t step) {
    std::vector<float> g(which.size() * 4);
    for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>((i * 37 + step) % 11) - 5.0f;
    ASSERT_TRUE(c.PushGradients("serve.t", which, g, step).ok());
  };
  for (int64_t step = 1; step <= 3; ++step) {
    push(*client_, ids, step);
    push(*reference, ids, step);
  }
  const std::vector<int64_t> late(ids.begin(), ids.begin() + 100);
  push(*client_, late, 10);
  push(*reference, late, 10);
  const auto before = Rows("serve.t", ids);

  const std::string all = absl::StrCat(root_, "/all.npz"),
                    delta = absl::StrCat(root_, "/delta.npz");
  Result exported = Cli(absl::StrCat("export --table=serve.t --with_state --out=", all));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_THAT(exported.output, HasSubstr("exported 3000 rows"));
  Result since = Cli(absl::StrCat("export --table=serve.t --since_step=10 --out=", delta));
  ASSERT_EQ(since.exit_code, 0) << since.output;
  EXPECT_THAT(since.output, HasSubstr("exported 100 rows"));

  ASSERT_EQ(Cli("drop --table=serve.t").exit_code, 0);
  ASSERT_TRUE(client_->CreateTable(config).ok());
  EXPECT_NE(Rows("serve.t", ids), before);
  Result imported = Cli(absl::StrCat("import --table=serve.t --in=", all));
  ASSERT_EQ(imported.exit_code, 0) << imported.output;
  EXPECT_THAT(imported.output, HasSubstr("imported 3000 rows"));
  EXPECT_EQ(Rows("serve.t", ids), before);
  // Optimizer state and update counts came along: the next update matches the original's.
  push(*client_, ids, 11);
  push(*reference, ids, 11);
  std::vector<float> want(ids.size() * 4);
  embedding::LookupOptions read_only;
  read_only.insert_missing = false;
  ASSERT_TRUE(reference->Lookup("serve.t", ids, absl::MakeSpan(want), read_only).ok());
  EXPECT_EQ(Rows("serve.t", ids), want);
  // A file of another dim is refused, naming it.
  ASSERT_TRUE(client_->CreateTable(Table("serve.wide")).ok());
  v1::TableConfig wide = Table("serve.eight");
  wide.set_dim(8);
  ASSERT_TRUE(client_->CreateTable(wide).ok());
  ExpectCliRefuses(absl::StrCat("import --table=serve.eight --in=", delta), "dim");
}

// Gradients of a repeated id that sum to Inf are refused before any shard applies its
// part, through the smart client and through the coordinator.
TEST_F(SharedClusterTest, GradientsThatSumToInfChangeNoShard) {
  ASSERT_TRUE(client_->CreateTable(Table("inf.t")).ok());
  client::ClientOptions routed;
  routed.mode = client::ClientOptions::Mode::kCoordinator;
  auto via = client::EmbeddingClient::Connect(address(), routed).value();
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 40; ++i) ids.push_back(i);  // both shards
  const auto before = Rows("inf.t", ids);
  std::vector<int64_t> pushed = ids;
  pushed.push_back(ids.back());
  std::vector<float> g(pushed.size() * 4, 0.25f);
  // Through both clients: refused, in words with `words`, and no row changed.
  auto expect_refused = [&](const std::vector<float>& g, const std::string& words) {
    for (embedding::EmbeddingCollection* c :
         {static_cast<embedding::EmbeddingCollection*>(client_.get()),
          static_cast<embedding::EmbeddingCollection*>(via.get())}) {
      absl::Status s = c->PushGradients("inf.t", pushed, g, 1);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr(words));
      EXPECT_EQ(Rows("inf.t", ids), before);
    }
  };
  for (int j = 0; j < 4; ++j) g[39 * 4 + j] = g[40 * 4 + j] = -3e38f;
  expect_refused(g, "summed over repeated ids");
  // A NaN sent is named where it was sent, by the layer that checks the push first.
  g[39 * 4 + 1] = g[40 * 4 + 1] = 0.25f;
  g[40 * 4 + 2] = std::nanf("");
  expect_refused(g, "(position 40, column 2) is nan");
}

// Ids are 64-bit patterns in every client: the CLI takes an unsigned hash as the int64 of
// the same bits, as the C++ and Python clients do.
TEST_F(SharedClusterTest, TheCliTakesUnsignedIdsBitForBit) {
  ASSERT_TRUE(client_->CreateTable(Table("ids.t")).ok());
  Result unsigned_id = Cli("lookup --table=ids.t --ids=18446744073709551615");
  Result signed_id = Cli("lookup --table=ids.t --ids=-1");
  ASSERT_EQ(unsigned_id.exit_code, 0) << unsigned_id.output;
  EXPECT_THAT(unsigned_id.output, HasSubstr("-1:"));
  EXPECT_EQ(unsigned_id.output, signed_id.output);
  EXPECT_EQ(Cli("lookup --table=ids.t --ids=18446744073709551616").exit_code, 1);
}

std::string EvalLine(const std::string& metrics) {
  std::ifstream in(metrics);
  for (std::string l; std::getline(in, l);) {
    if (absl::StrContains(l, "\"event\":\"eval\"")) {
      // Without the timing field.
      return l.substr(0, l.find(",\"train_seconds\""));
    }
  }
  return "";
}

bool FileHas(const std::string& path, const std::string& text) {
  std::ifstream in(path);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return absl::StrContains(all, text);
}

// Item 7: a shard killed and back within the client's retry window. Its CHECKPOINT tables
// are back at the checkpoint: the run sees the new incarnation, restores the model to its
// checkpoint and trains on from there, ending exactly where an uninterrupted run ends; with
// --on_shard_restart=fail it stops saying what to do.
TEST_F(SharedClusterTest, AShardRestartedMidRunSendsTheModelBackToItsCheckpoint) {
  const std::string common = "--steps=1500 --batch_size=128 --log_every=100 --held_out=2000";
  const std::string reference = absl::StrCat(root_, "/reference.jsonl");
  Result straight =
      RunBinary(TESSERA_TRAIN_BIN, absl::StrCat(common, " --metrics_out=", reference));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;

  for (const std::string mode : {"resume", "fail"}) {
    const std::string metrics = absl::StrCat(root_, "/", mode, ".jsonl");
    Result run;
    std::thread train([&] {
      run = RunBinary(TESSERA_TRAIN_BIN,
                      absl::StrCat(common, " --coordinator=", address(), " --model=", mode,
                                   " --checkpoint_every=100 --on_shard_restart=", mode,
                                   " --metrics_out=", metrics));
    });
    // Once the run has checkpointed step 300, shard 1 is killed and started again.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!FileHas(metrics, "\"event\":\"checkpoint\",\"step\":300") &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const bool restarted = cluster_->RestartShard(1);
    train.join();
    ASSERT_TRUE(restarted);
    if (mode == "resume") {
      ASSERT_EQ(run.exit_code, 0) << run.output;
      EXPECT_THAT(run.output, HasSubstr("a shard restarted at step"));
      EXPECT_THAT(run.output, HasSubstr("restored to its checkpoint"));
      EXPECT_EQ(EvalLine(metrics), EvalLine(reference));
      EXPECT_FALSE(EvalLine(metrics).empty());
    } else {
      EXPECT_EQ(run.exit_code, 1) << run.output;
      EXPECT_THAT(run.output, HasSubstr("went back to their newest checkpoint"));
      EXPECT_THAT(run.output, HasSubstr("run again with --resume=auto"));
    }
  }
}

}  // namespace
}  // namespace tessera
