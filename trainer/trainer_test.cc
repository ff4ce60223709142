#include "trainer/trainer.h"

#include "gtest/gtest.h"
#include "trainer/input_pipeline.h"
#include "trainer/synthetic.h"

namespace tessera::trainer {
namespace {

struct TrainedRun {
  std::vector<double> losses;
  EvalResult eval;
};

TrainedRun TrainSynthetic(int shards, uint64_t seed, int reader_threads = 1, int steps = 150) {
  DlrmConfig model;
  model.num_sparse = 4;
  model.emb_dim = 8;
  model.bottom_mlp = {16};
  model.top_mlp = {16};
  model.seed = seed;
  model.learning_rate = 3e-3f;
  auto dense = NewCpuDenseBackend(model);
  EXPECT_TRUE(dense.ok());
  auto tables = embedding::NewInProcessCollection(shards);
  EXPECT_TRUE(tables.ok());
  TrainerOptions options;
  options.print_progress = false;
  Trainer trainer(tables->get(), dense->get(), options);
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
      [g](int64_t i, Batch* b) {
        g->MakeBatch(i, 128, b);
        return absl::OkStatus();
      },
      steps, reader_threads, 4);
  auto result = trainer.Train(&source, steps);
  EXPECT_TRUE(result.ok()) << result.status();
  auto eval = trainer.Evaluate(g->MakeHeldOut(5000));
  EXPECT_TRUE(eval.ok());
  return TrainedRun{result->losses, *eval};
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
