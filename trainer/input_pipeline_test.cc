#include "trainer/input_pipeline.h"

#include <atomic>

#include "gtest/gtest.h"

namespace tessera::trainer {
namespace {

absl::Status MakeNumbered(int64_t index, Batch* b) {
  b->Reset(1);
  b->size = 1;
  b->labels = {static_cast<float>(index)};
  return absl::OkStatus();
}

TEST(ParallelBatchPipeline, DeliversBatchesInIndexOrderWhateverTheThreadCount) {
  for (int threads : {1, 2, 5}) {
    ParallelBatchPipeline p(MakeNumbered, 37, threads, 2);
    Batch b;
    for (int64_t i = 0; i < 37; ++i) {
      auto more = p.Next(&b);
      ASSERT_TRUE(more.ok() && *more);
      EXPECT_EQ(b.index, i);
      EXPECT_EQ(b.labels[0], static_cast<float>(i));
    }
    auto end = p.Next(&b);
    ASSERT_TRUE(end.ok());
    EXPECT_FALSE(*end);
  }
}

TEST(ParallelBatchPipeline, PrefetchIsBounded) {
  std::atomic<int> made{0};
  {
    ParallelBatchPipeline p(
        [&](int64_t i, Batch* b) {
          ++made;
          return MakeNumbered(i, b);
        },
        1000, 2, 3);
    Batch b;
    ASSERT_TRUE(*p.Next(&b));
    // Wait (bounded) for the producers to fill their queues.
    for (int i = 0; i < 200 && made.load() < 7; ++i) absl::SleepFor(absl::Milliseconds(5));
    absl::SleepFor(absl::Milliseconds(20));
    // 2 queues of 3, plus the one consumed and one blocked in Push per thread.
    EXPECT_LE(made.load(), 1 + 2 * 3 + 2);
  }  // the destructor stops the producers
  EXPECT_LT(made.load(), 20);
}

TEST(ParallelBatchPipeline, PassesOnTheMakersError) {
  ParallelBatchPipeline p(
      [](int64_t i, Batch* b) {
        if (i == 3) return absl::DataLossError("bad batch 3");
        return MakeNumbered(i, b);
      },
      10, 2, 2);
  Batch b;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(*p.Next(&b));
  auto s = p.Next(&b);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
}

class CountingSource : public BatchSource {
 public:
  explicit CountingSource(int n, bool fail_at_end) : n_(n), fail_(fail_at_end) {}
  absl::StatusOr<bool> Next(Batch* b) override {
    if (i_ == n_) {
      if (fail_) return absl::InvalidArgumentError("line 9: bad");
      return false;
    }
    MakeNumbered(i_++, b).IgnoreError();
    return true;
  }

 private:
  int n_, i_ = 0;
  bool fail_;
};

TEST(PrefetchingSource, ForwardsBatchesEndAndErrors) {
  PrefetchingSource ok(std::make_unique<CountingSource>(5, false), 2);
  Batch b;
  for (int i = 0; i < 5; ++i) {
    auto more = ok.Next(&b);
    ASSERT_TRUE(more.ok() && *more);
    EXPECT_EQ(b.labels[0], static_cast<float>(i));
  }
  EXPECT_FALSE(*ok.Next(&b));
  EXPECT_FALSE(*ok.Next(&b));

  PrefetchingSource bad(std::make_unique<CountingSource>(2, true), 2);
  EXPECT_TRUE(*bad.Next(&b));
  EXPECT_TRUE(*bad.Next(&b));
  EXPECT_EQ(bad.Next(&b).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BoundedQueue, CloseWakesBlockedConsumers) {
  BoundedQueue<int> q(1);
  EXPECT_TRUE(q.Push(1));
  std::thread consumer([&] {
    EXPECT_EQ(q.Pop(), 1);
    EXPECT_EQ(q.Pop(), std::nullopt);
  });
  absl::SleepFor(absl::Milliseconds(10));
  q.Close();
  consumer.join();
  EXPECT_FALSE(q.Push(2));
}

}  // namespace
}  // namespace tessera::trainer
