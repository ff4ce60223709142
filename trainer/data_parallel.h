#ifndef TESSERA_TRAINER_DATA_PARALLEL_H_
#define TESSERA_TRAINER_DATA_PARALLEL_H_

// Data-parallel dense workers on gloo: N trainer processes (possibly on N hosts) keep
// identical copies of the dense model and allreduce its gradients every step over gloo's
// TCP transport. They find each other through a key-value store (the coordinator's
// rendezvous RPCs): each worker publishes the address its transport listens on.
//
// A run's workers join generation g of their job: the job's counter of joins, divided by
// N, so a job restarted with all its workers meets under fresh keys. Start (and restart)
// all the workers of a job together.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "trainer/batch.h"

namespace gloo {
class Context;
}

namespace tessera::trainer {

// The rendezvous store the workers meet in.
class RendezvousKv {
 public:
  virtual ~RendezvousKv() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Values of `keys` once every one exists; DeadlineExceeded after `timeout`.
  virtual absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                                       std::chrono::milliseconds timeout) = 0;
  virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;
};

// A rendezvous store in this process, for workers that are threads of one process
// (benchmarks, tests).
class InProcessRendezvous final : public RendezvousKv {
 public:
  InProcessRendezvous();
  ~InProcessRendezvous() override;
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               std::chrono::milliseconds timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

struct DataParallelOptions {
  std::string job;  // every worker of a run says the same (the model's name)
  int num_workers = 1;
  int worker_index = 0;
  // The address this worker's transport listens on (the port is the OS's choice); other
  // workers must reach it.
  std::string host = "127.0.0.1";
  // How long to wait for every worker to join.
  std::chrono::milliseconds rendezvous_timeout{std::chrono::minutes(5)};
  // How long a collective waits for the other workers before it fails.
  std::chrono::milliseconds timeout{std::chrono::seconds(20)};
};

class DataParallel {
 public:
  // Joins the job: publishes this worker's address in `kv`, waits for every other
  // worker's and connects to each. InvalidArgument for a bad index or count or a worker
  // index taken twice; DeadlineExceeded naming the workers that did not come. Ignores
  // SIGPIPE in this process from then on (a peer's closed socket is an error, not a kill).
  static absl::StatusOr<std::unique_ptr<DataParallel>> Join(RendezvousKv* kv,
                                                            const DataParallelOptions& options);
  ~DataParallel();

  int rank() const { return options_.worker_index; }
  int size() const { return options_.num_workers; }
  int64_t generation() const { return generation_; }

  // Replaces `values` on every worker by the mean of the workers' values (a ring
  // allreduce of the sums, then × 1/N): the same bits on every worker. Aborted, naming the
  // workers that stopped answering, when one fails.
  absl::Status AllreduceMean(absl::Span<float> values);
  // Every worker's `mine` (same size on each), in worker order.
  absl::StatusOr<std::vector<std::string>> AllGather(const std::string& mine);
  // Worker `root`'s `bytes` on every worker (any size; the others' are replaced).
  absl::Status Broadcast(std::string* bytes, int root = 0,
                         std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  // Waits until every worker gets here, at most `timeout` (default: the options' timeout).
  absl::Status Barrier(std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

  // Seconds spent in AllreduceMean so far, and how many calls.
  double allreduce_seconds() const { return allreduce_seconds_; }
  int64_t allreduces() const { return allreduces_; }

 private:
  DataParallel(RendezvousKv* kv, const DataParallelOptions& options, int64_t generation)
      : kv_(kv), options_(options), generation_(generation) {}
  std::string Key(const std::string& name) const;
  // The error for a failed collective `what`: names the workers that did not report the
  // failure through the store within a few seconds (stopped or cut off).
  absl::Status Failed(const std::string& what, const std::string& detail);
  // Runs collective `what` as run(tag) with the next tag: gloo's exception becomes
  // Failed's error, success moves the tag on (every worker runs the same collectives in
  // the same order, so their tags agree).
  template <typename Fn>
  absl::Status Collective(const char* what, Fn&& run);

  RendezvousKv* kv_;
  const DataParallelOptions options_;
  const int64_t generation_;
  std::shared_ptr<gloo::Context> context_;
  uint32_t next_tag_ = 1;
  double allreduce_seconds_ = 0;
  int64_t allreduces_ = 0;
};

// A source whose workers end together: every Next asks all workers whether they have a
// batch, and the data ends for all when it ends for one (a worker's last batches beyond
// the shortest share are not trained). Workers reading files whose shares differ in
// length need it; synthetic data has the same number of steps on every worker.
class AgreedEndSource final : public BatchSource {
 public:
  AgreedEndSource(std::unique_ptr<BatchSource> inner, DataParallel* dp)
      : inner_(std::move(inner)), dp_(dp) {}
  absl::StatusOr<bool> Next(Batch* batch) override;

 private:
  std::unique_ptr<BatchSource> inner_;
  DataParallel* dp_;
  bool ended_ = false;
};

// A digest of `values`' bits, to check that workers hold the same parameters.
uint64_t Fingerprint(absl::Span<const float> values);

}  // namespace tessera::trainer

#endif  // TESSERA_TRAINER_DATA_PARALLEL_H_
