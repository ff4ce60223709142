#ifndef TESSERA_TRAINER_INPUT_PIPELINE_H_
#define TESSERA_TRAINER_INPUT_PIPELINE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "trainer/batch.h"
#include "trainer/bounded_queue.h"

namespace tessera::trainer {

// Makes batch `index`; a pure function of the index keeps training deterministic.
using BatchMaker = std::function<absl::Status(int64_t index, Batch* batch)>;

// Runs `make` for batches [0, num_batches) on `threads` background threads (batch i on
// thread i % threads, each with a queue of `depth` batches) and hands them out in index
// order, so the stream is the same whatever the thread count. The destructor stops and
// joins the threads. Next() is for one consumer thread.
class ParallelBatchPipeline final : public BatchSource {
 public:
  ParallelBatchPipeline(BatchMaker make, int64_t num_batches, int threads, int depth);
  ~ParallelBatchPipeline() override;

  absl::StatusOr<bool> Next(Batch* batch) override;

 private:
  struct Item {
    absl::Status status;
    Batch batch;
  };

  BatchMaker make_;
  int64_t num_batches_;
  int64_t next_ = 0;
  std::vector<std::unique_ptr<BoundedQueue<Item>>> queues_;
  std::vector<std::thread> threads_;
};

// Reads a sequential source on one background thread, up to `depth` batches ahead of
// the consumer. The first error ends the stream and is returned by Next().
class PrefetchingSource final : public BatchSource {
 public:
  PrefetchingSource(std::unique_ptr<BatchSource> inner, int depth);
  ~PrefetchingSource() override;

  absl::StatusOr<bool> Next(Batch* batch) override;

 private:
  struct Item {
    absl::Status status;
    bool end = false;
    Batch batch;
  };

  std::unique_ptr<BatchSource> inner_;
  BoundedQueue<Item> queue_;
  bool done_ = false;
  std::thread thread_;
};

// A source that ends early once `*stop` is set (a stop a signal asked for): the batches
// already handed out are trained, and Next answers false from then on. Under
// data-parallel training it goes beneath the AgreedEndSource, so that every worker ends
// at the same step.
class StoppableSource final : public BatchSource {
 public:
  StoppableSource(std::unique_ptr<BatchSource> inner, const std::atomic<bool>* stop)
      : inner_(std::move(inner)), stop_(stop) {}
  absl::StatusOr<bool> Next(Batch* batch) override {
    if (stop_->load(std::memory_order_relaxed)) return false;
    return inner_->Next(batch);
  }

 private:
  std::unique_ptr<BatchSource> inner_;
  const std::atomic<bool>* stop_;
};

}  // namespace tessera::trainer

#endif  // TESSERA_TRAINER_INPUT_PIPELINE_H_
