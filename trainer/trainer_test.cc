#include "trainer/trainer.h"

#include <filesystem>

#include "embedding/forwarding_collection.h"
#include "embedding/storage/durable_collection.h"
#include "gtest/gtest.h"
#include "trainer/input_pipeline.h"
#include "trainer/synthetic.h"

namespace tessera::trainer {
namespace {

struct TrainedRun {
  std::vector<double> losses;
  EvalResult eval;
  StepTimes times;
  StepTimes first;       // after the first Trainer::kFirstSteps steps
  int carried = 0;       // pushes sent with a lookup (PushThenLookup)
  int alone = 0;         // pushes sent on their own (PushBatch)
  int lookups_read = 0;  // lookups that created no row (evaluation)
};

// An in-process collection that says it carries a push with the next lookup (as a remote
// one does), and counts how each push went.
class CarryingCollection final : public embedding::ForwardingCollection {
 public:
  using ForwardingCollection::ForwardingCollection;
  bool FusesPushAndLookup() const override { return true; }
  absl::Status PushThenLookup(absl::Span<const embedding::TableGradients> push, int64_t step,
                              const embedding::PushOptions& push_options,
                              absl::Span<const embedding::TableBags> lookups,
                              const embedding::LookupOptions& options) override {
    ++carried;
    pushing_ = true;
    absl::Status s =
        EmbeddingCollection::PushThenLookup(push, step, push_options, lookups, options);
    pushing_ = false;
    return s;
  }
  absl::Status PushBatch(absl::Span<const embedding::TableGradients> tables, int64_t step,
                         const embedding::PushOptions& options) override {
    if (!pushing_) ++alone;  // not PushThenLookup's own
    return ForwardingCollection::PushBatch(tables, step, options);
  }
  absl::Status LookupBatch(absl::Span<const embedding::TableBags> tables,
                           const embedding::LookupOptions& options) override {
    if (!options.insert_missing) ++lookups_read;
    return ForwardingCollection::LookupBatch(tables, options);
  }

  int carried = 0, alone = 0, lookups_read = 0;

 private:
  bool pushing_ = false;
};

TrainedRun TrainSynthetic(int shards, uint64_t seed, int reader_threads = 1, int steps = 150,
                          int max_staleness = 0, int sparse_threads = 1, int batch_size = 128,
                          bool carry_pushes = false) {
  DlrmConfig model;
  model.num_sparse = 4;
  model.emb_dim = 8;
  model.bottom_mlp = {16};
  model.top_mlp = {16};
  model.seed = seed;
  model.learning_rate = 3e-3f;
  auto dense = NewCpuDenseBackend(model);
  EXPECT_TRUE(dense.ok());
  TrainerOptions options;
  options.print_progress = false;
  options.max_staleness = max_staleness;
  options.sparse_pool = std::make_shared<base::ThreadPool>(sparse_threads);
  embedding::InProcessOptions in_process;
  in_process.num_shards = shards;
  in_process.pool = options.sparse_pool;
  auto tables = embedding::NewInProcessCollection(in_process);
  EXPECT_TRUE(tables.ok());
  CarryingCollection carrying(tables->get());
  embedding::EmbeddingCollection* trained =
      carry_pushes ? static_cast<embedding::EmbeddingCollection*>(&carrying) : tables->get();
  Trainer trainer(trained, dense->get(), options);
  v1::TableConfig proto;
  proto.set_dim(8);
  proto.set_seed(seed);
  proto.mutable_optimizer()->set_type(v1::ADAGRAD);
  proto.mutable_optimizer()->set_learning_rate(0.05f);
  proto.mutable_initializer()->set_scale(0.05f);
  EXPECT_TRUE(trainer.CreateTables(proto).ok());

  SyntheticConfig sc;
  sc.cardinalities = {20, 200, 50, 1000};
  sc.seed = seed;
  auto gen = SyntheticGenerator::Create(sc);
  EXPECT_TRUE(gen.ok());
  const SyntheticGenerator* g = gen->get();
  ParallelBatchPipeline source(
      [g, batch_size](int64_t i, Batch* b) {
        g->MakeBatch(i, batch_size, b);
        return absl::OkStatus();
      },
      steps, reader_threads, 4);
  auto result = trainer.Train(&source, steps);
  EXPECT_TRUE(result.ok()) << result.status();
  const int alone_before_eval = carrying.alone;
  auto eval = trainer.Evaluate(g->MakeHeldOut(5000));
  EXPECT_TRUE(eval.ok());
  EXPECT_EQ(carrying.alone, alone_before_eval) << "Train pushed every step it held";
  return TrainedRun{
      result->losses,   *eval,          trainer.step_times(), trainer.first_step_times(),
      carrying.carried, carrying.alone, carrying.lookups_read};
}

// Steps [from, to) of a small model on durable tables in `dir`; with `resume` the dense
// state and tables come from the newest checkpoint first. Returns the losses.
std::vector<double> RunDurable(const std::string& dir, int64_t from, int64_t to, bool resume,
                               int64_t checkpoint_every) {
  DlrmConfig model;
  model.num_sparse = 3;
  model.emb_dim = 8;
  model.bottom_mlp = {16};
  model.top_mlp = {16};
  model.seed = resume ? 999 : 5;  // a resumed model's parameters must all come from disk
  auto dense = NewCpuDenseBackend(model).value();
  storage::DurableOptions o;
  o.data_dir = dir;
  o.num_shards = 2;
  o.log = [](const std::string&) {};
  auto tables = storage::DurableCollection::Open(o).value();
  TrainerOptions options;
  options.print_progress = false;
  options.checkpoint_every = checkpoint_every;
  options.run_signature = "trainer_test";
  Trainer trainer(tables.get(), dense.get(), options);
  v1::TableConfig proto;
  proto.set_dim(8);
  proto.set_seed(5);
  proto.mutable_optimizer()->set_type(v1::ADAM);
  proto.mutable_optimizer()->set_learning_rate(0.01f);
  if (resume) {
    EXPECT_TRUE(trainer.CheckTables(proto).ok());
    auto step = trainer.Resume();
    EXPECT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(*step, from);
  } else {
    EXPECT_TRUE(trainer.CreateTables(proto).ok());
  }
  SyntheticConfig sc;
  sc.cardinalities = {30, 300, 3000};
  sc.seed = 5;
  auto gen = SyntheticGenerator::Create(sc).value();
  const SyntheticGenerator* g = gen.get();
  ParallelBatchPipeline source(
      [g, from](int64_t i, Batch* b) {
        g->MakeBatch(from + i, 64, b);
        return absl::OkStatus();
      },
      to - from, 1, 4);
  auto result = trainer.Train(&source, to, from);
  EXPECT_TRUE(result.ok()) << result.status();
  return result->losses;
}

TEST(Trainer, ResumedFromACheckpointContinuesBitForBit) {
  const std::string root = ::testing::TempDir() + "/trainer-resume";
  std::filesystem::remove_all(root);
  const auto straight = RunDurable(root + "/a", 0, 120, false, 0);
  const auto first = RunDurable(root + "/b", 0, 60, false, 30);
  const auto rest = RunDurable(root + "/b", 60, 120, true, 30);
  ASSERT_EQ(straight.size(), 120u);
  EXPECT_EQ(std::vector<double>(straight.begin(), straight.begin() + 60), first);
  EXPECT_EQ(std::vector<double>(straight.begin() + 60, straight.end()), rest);  // exact doubles
  std::filesystem::remove_all(root);
}

TEST(Trainer, SameSeedGivesSameLossTrajectory) {
  TrainedRun a = TrainSynthetic(2, 5);
  TrainedRun b = TrainSynthetic(2, 5);
  ASSERT_EQ(a.losses.size(), 150u);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.eval.auc, b.eval.auc);
  TrainedRun c = TrainSynthetic(2, 6);
  EXPECT_NE(a.losses, c.losses);
}

TEST(Trainer, ResultDoesNotDependOnShardOrReaderThreadCount) {
  TrainedRun one = TrainSynthetic(1, 5, 1);
  TrainedRun four = TrainSynthetic(4, 5, 3);
  EXPECT_EQ(one.losses, four.losses) << "bit-identical loss trajectory";
  EXPECT_EQ(one.eval.logloss, four.eval.logloss);
}

TEST(Trainer, ResultDoesNotDependOnSparseThreadCount) {
  // Batches of 4 x 1024 ids: enough for the tables' work to run on the pool.
  for (const int staleness : {0, 1}) {
    TrainedRun one = TrainSynthetic(3, 5, 1, 40, staleness, 1, 1024);
    for (const int threads : {2, 7}) {
      TrainedRun many = TrainSynthetic(3, 5, 1, 40, staleness, threads, 1024);
      EXPECT_EQ(one.losses, many.losses) << threads << " threads, staleness " << staleness;
      EXPECT_EQ(one.eval.logloss, many.eval.logloss);
    }
  }
}

// On a collection that carries a push with the next lookup, each synchronous step's push
// rides on the next step's lookup and the last goes alone when training ends: the same
// losses and held-out results as pushing each step at once (the lookup reads the push
// either way). Pipelined steps push as before.
TEST(Trainer, APushCarriedByTheNextLookupTrainsTheSameAsAPushAtOnce) {
  const TrainedRun at_once = TrainSynthetic(2, 5, 1, 60);
  const TrainedRun carried = TrainSynthetic(2, 5, 1, 60, 0, 1, 128, /*carry_pushes=*/true);
  EXPECT_EQ(carried.losses, at_once.losses);
  EXPECT_EQ(carried.eval.logloss, at_once.eval.logloss);
  EXPECT_EQ(carried.eval.auc, at_once.eval.auc);
  EXPECT_EQ(carried.carried, 59);
  EXPECT_EQ(carried.alone, 1);
  EXPECT_GT(carried.lookups_read, 0);
  const TrainedRun piped = TrainSynthetic(2, 5, 1, 60, 1, 1, 128, /*carry_pushes=*/true);
  EXPECT_EQ(piped.carried, 0);
  EXPECT_EQ(piped.alone, 60);
}

TEST(Trainer, StepTimesSayWhatTheTablesTookAndWhatAStepTook) {
  // Synchronous: a step is its parts one after another, the tables' work three of them.
  const StepTimes sync = TrainSynthetic(2, 5, 1, 40, 0, 2).times;
  EXPECT_EQ(sync.steps, 40);
  EXPECT_GT(sync.lookup, 0);
  EXPECT_GT(sync.push, 0);
  EXPECT_NEAR(sync.sparse_work, sync.lookup + sync.grads + sync.push, 1e-9);
  EXPECT_NEAR(sync.wall,
              sync.lookup + sync.dense + sync.grads + sync.allreduce + sync.push + sync.optimizer,
              1e-9);
  // Pipelined: the sparse thread's lookups and pushes count whether waited for or not.
  const StepTimes piped = TrainSynthetic(2, 5, 1, 40, 1, 2).times;
  EXPECT_EQ(piped.steps, 40);
  EXPECT_GT(piped.sparse_work, piped.grads);
  EXPECT_GT(piped.wall, piped.dense);
}

// The first steps (which create most rows) are kept apart: what the times were after them,
// in both modes; a run shorter than them has none.
TEST(Trainer, StepTimesKeepTheFirstStepsApart) {
  EXPECT_EQ(TrainSynthetic(2, 5, 1, 40, 0, 2).first.steps, 0);
  for (const int staleness : {0, 1}) {
    const TrainedRun run = TrainSynthetic(2, 5, 1, 150, staleness, 2);
    EXPECT_EQ(run.first.steps, Trainer::kFirstSteps) << "staleness " << staleness;
    EXPECT_EQ(run.times.steps, 150);
    EXPECT_GT(run.first.sparse_work, 0);
    EXPECT_LT(run.first.sparse_work, run.times.sparse_work);
    EXPECT_LT(run.first.wall, run.times.wall);
    EXPECT_LE(run.first.dense, run.times.dense);
  }
}

TEST(Trainer, BoundedStalenessReplaysExactlyAndTrainsAsWellAsSynchronous) {
  TrainedRun sync = TrainSynthetic(2, 7, 1, 600);
  TrainedRun stale = TrainSynthetic(2, 7, 1, 600, /*max_staleness=*/1);
  TrainedRun again = TrainSynthetic(2, 7, 1, 600, /*max_staleness=*/1);
  ASSERT_EQ(stale.losses.size(), 600u);
  EXPECT_EQ(stale.losses, again.losses) << "one sparse thread, a fixed order: deterministic";
  EXPECT_NE(stale.losses, sync.losses) << "lookups ahead of the pushes must see older rows";
  EXPECT_EQ(stale.losses[0], sync.losses[0]);  // nothing pushed before the first step
  EXPECT_NEAR(stale.eval.auc, sync.eval.auc, 0.005);
  TrainedRun deeper = TrainSynthetic(2, 7, 1, 600, /*max_staleness=*/3);
  EXPECT_NEAR(deeper.eval.auc, sync.eval.auc, 0.01);
}

TEST(Trainer, LearnsTowardsTheTeacher) {
  TrainedRun r = TrainSynthetic(2, 7, 1, 600);
  double first = 0, last = 0;
  for (int i = 0; i < 50; ++i) first += r.losses[i];
  for (size_t i = r.losses.size() - 50; i < r.losses.size(); ++i) last += r.losses[i];
  EXPECT_LT(last, first * 0.9);
  ASSERT_TRUE(r.eval.has_teacher);
  EXPECT_GT(r.eval.auc, 0.5 + 0.6 * (r.eval.teacher_auc - 0.5))
      << "auc " << r.eval.auc << " teacher " << r.eval.teacher_auc;
  EXPECT_LE(r.eval.auc, r.eval.teacher_auc + 0.01);
}

TEST(Trainer, RejectsTablesWhoseDimDiffersFromTheModel) {
  DlrmConfig model;
  model.num_sparse = 2;
  model.emb_dim = 8;
  auto dense = NewCpuDenseBackend(model);
  auto tables = embedding::NewInProcessCollection(1);
  ASSERT_TRUE(dense.ok() && tables.ok());
  Trainer trainer(tables->get(), dense->get(), TrainerOptions());
  v1::TableConfig proto;
  proto.set_dim(4);
  EXPECT_EQ(trainer.CreateTables(proto).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Trainer::TableNames(3), (std::vector<std::string>{"C1", "C2", "C3"}));
}

}  // namespace
}  // namespace tessera::trainer
