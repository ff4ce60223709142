#include "trainer/input_pipeline.h"

#include <algorithm>

namespace tessera::trainer {

ParallelBatchPipeline::ParallelBatchPipeline(BatchMaker make, int64_t num_batches, int threads,
                                             int depth)
    : make_(std::move(make)), num_batches_(num_batches) {
  threads = std::max(1, threads);
  for (int t = 0; t < threads; ++t) {
    queues_.push_back(std::make_unique<BoundedQueue<Item>>(std::max(1, depth)));
  }
  for (int t = 0; t < threads; ++t) {
    threads_.emplace_back([this, t, threads] {
      BoundedQueue<Item>& q = *queues_[t];
      for (int64_t i = t; i < num_batches_; i += threads) {
        Item item;
        item.status = make_(i, &item.batch);
        item.batch.index = i;
        const bool failed = !item.status.ok();
        if (!q.Push(std::move(item)) || failed) break;
      }
    });
  }
}

ParallelBatchPipeline::~ParallelBatchPipeline() {
  for (auto& q : queues_) q->Close();
  for (auto& t : threads_) t.join();
}

absl::StatusOr<bool> ParallelBatchPipeline::Next(Batch* batch) {
  if (next_ >= num_batches_) return false;
  std::optional<Item> item = queues_[next_ % queues_.size()]->Pop();
  if (!item.has_value()) return absl::CancelledError("input pipeline stopped");
  if (!item->status.ok()) return item->status;
  *batch = std::move(item->batch);
  ++next_;
  return true;
}

PrefetchingSource::PrefetchingSource(std::unique_ptr<BatchSource> inner, int depth)
    : inner_(std::move(inner)), queue_(std::max(1, depth)) {
  thread_ = std::thread([this] {
    while (true) {
      Item item;
      absl::StatusOr<bool> more = inner_->Next(&item.batch);
      if (!more.ok()) {
        item.status = more.status();
      } else {
        item.end = !*more;
      }
      const bool last = !item.status.ok() || item.end;
      if (!queue_.Push(std::move(item)) || last) break;
    }
  });
}

PrefetchingSource::~PrefetchingSource() {
  queue_.Close();
  thread_.join();
}

absl::StatusOr<bool> PrefetchingSource::Next(Batch* batch) {
  if (done_) return false;
  std::optional<Item> item = queue_.Pop();
  if (!item.has_value()) return absl::CancelledError("input pipeline stopped");
  if (!item->status.ok()) {
    done_ = true;
    return item->status;
  }
  if (item->end) {
    done_ = true;
    return false;
  }
  *batch = std::move(item->batch);
  return true;
}

}  // namespace tessera::trainer
