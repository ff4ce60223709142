#include "trainer/resume.h"

#include "embedding/storage/durable_collection.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "trainer/input_pipeline.h"
#include "trainer/synthetic.h"

namespace tessera::trainer {
namespace {

TEST(ResumeOffer, EachKindSurvivesItsEncoding) {
  const ResumeOffer restored{ResumeOffer::Kind::kRestored, 1234567890123, std::string("\0ab", 3),
                             ""};
  absl::StatusOr<ResumeOffer> back = DecodeResumeOffer(EncodeResumeOffer(restored));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, ResumeOffer::Kind::kRestored);
  EXPECT_EQ(back->step, 1234567890123);
  EXPECT_EQ(back->dense_state, std::string("\0ab", 3));

  back = DecodeResumeOffer(EncodeResumeOffer({ResumeOffer::Kind::kFresh, 0, "", ""}));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, ResumeOffer::Kind::kFresh);
  EXPECT_EQ(back->step, 0);

  back = DecodeResumeOffer(EncodeResumeOffer({ResumeOffer::Kind::kRefused, 0, "", "no room"}));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, ResumeOffer::Kind::kRefused);
  EXPECT_EQ(back->reason, "no room");
}

TEST(ResumeOffer, BytesItDidNotMakeAreRefused) {
  for (const std::string& bytes : {std::string(), std::string("S123"), std::string("Nx"),
                                   std::string("?"), std::string("s\1\2\3\4\5\6\7\10")}) {
    absl::StatusOr<ResumeOffer> offer = DecodeResumeOffer(bytes);
    EXPECT_TRUE(absl::IsInternal(offer.status())) << "'" << bytes << "': " << offer.status();
  }
}

// A single trainer (no data-parallel job) on durable tables without a checkpoint yet.
class ResumeOnOneTrainer : public ::testing::Test {
 protected:
  void SetUp() override {
    model_.num_sparse = 2;
    model_.emb_dim = 4;
    model_.bottom_mlp = {8};
    model_.top_mlp = {8};
    dense_ = NewCpuDenseBackend(model_).value();
    ASSERT_FALSE(dir_.path.empty());
    storage::DurableOptions durable;
    durable.data_dir = dir_.path;
    tables_ = std::move(storage::DurableCollection::Open(durable)).value();
    TrainerOptions options;
    options.print_progress = false;
    options.model = "m";
    trainer_ = std::make_unique<Trainer>(tables_.get(), dense_.get(), options);
    v1::TableConfig table;
    table.set_dim(4);
    table.mutable_optimizer()->set_type(v1::SGD);
    table.mutable_optimizer()->set_learning_rate(0.1f);
    ASSERT_TRUE(trainer_->CreateTables(table).ok());
  }

  testing::ScopedTempDir dir_;
  DlrmConfig model_;
  std::unique_ptr<DenseBackend> dense_;
  std::unique_ptr<embedding::EmbeddingCollection> tables_;
  std::unique_ptr<Trainer> trainer_;
};

TEST_F(ResumeOnOneTrainer, UntouchedTablesWithoutACheckpointStartAtStepZero) {
  absl::StatusOr<int64_t> step = ResumeOnEveryWorker(*trainer_, dense_.get(), nullptr, "m");
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 0);
}

TEST_F(ResumeOnOneTrainer, TrainedRowsWithoutACheckpointAreNotTrainedOverByANewNetwork) {
  SyntheticConfig sc;
  sc.num_dense = model_.num_dense;
  sc.cardinalities = {10, 10};
  auto gen = SyntheticGenerator::Create(sc).value();
  ParallelBatchPipeline source(
      [&](int64_t i, Batch* b) {
        gen->MakeBatch(i, 16, b);
        return absl::OkStatus();
      },
      3, 1, 2);
  ASSERT_TRUE(trainer_->Train(&source, 3).ok());
  absl::StatusOr<int64_t> step = ResumeOnEveryWorker(*trainer_, dense_.get(), nullptr, "m");
  EXPECT_TRUE(absl::IsFailedPrecondition(step.status())) << step.status();
  EXPECT_NE(step.status().message().find("has no complete checkpoint, but its tables hold"),
            std::string::npos)
      << step.status();
}

}  // namespace
}  // namespace tessera::trainer
