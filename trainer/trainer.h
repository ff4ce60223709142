#ifndef TESSERA_TRAINER_TRAINER_H_
#define TESSERA_TRAINER_TRAINER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "base/thread_pool.h"
#include "embedding/collection.h"
#include "tessera/v1/config.pb.h"
#include "trainer/batch.h"
#include "trainer/data_parallel.h"
#include "trainer/dense_backend.h"
#include "trainer/dense_snapshot.h"
#include "trainer/sparse_step.h"

namespace tessera::trainer {

// What the trainer reports every log_every steps.
struct Progress {
  int64_t step = 0;
  int64_t samples = 0;         // since the start of this run
  double samples_per_s = 0.0;  // over the last log_every steps
  double loss = 0.0;           // mean training loss over them
  double elapsed_s = 0.0;
};

struct TrainerOptions {
  // The model's name: its tables are "<model>.C1".."<model>.Cn" and its checkpoints hold
  // those tables only (embedding/collection.h). "" = tables C1..Cn, checkpoints of every
  // table of the collection.
  std::string model;
  int64_t log_every = 100;     // steps between progress lines and metric records; 0 = none
  std::string metrics_out;     // JSON Lines file for metrics; empty = none
  int eval_batch = 4096;       // samples per evaluation forward pass
  bool print_progress = true;  // progress lines on stdout
  // Steps between checkpoints of the tables and the dense state, taken through the
  // collection (which needs storage); also one after the last step. 0 = none.
  int64_t checkpoint_every = 0;
  // Steps between publications of the dense network for serving replicas, through
  // `dense_publisher` (which must then be set and outlive the trainer); also one after the
  // last step. 0 = none.
  int64_t publish_dense_every = 0;
  DensePublisher* dense_publisher = nullptr;
  // Existing tables whose learning rate differs from the prototype's get the prototype's
  // (EmbeddingCollection::AlterTable) instead of being refused.
  bool alter_tables = false;
  // Stored with each checkpoint (flags that shape the run); Resume refuses a checkpoint
  // whose signature differs, since it would not continue the same run.
  std::string run_signature;
  // Lookups run up to this many steps ahead of the pushes applied (bounded staleness, as
  // PERSIA does): step t's lookups do not see the updates of steps t-K..t-1, and while step
  // t's dense network runs, the next steps' lookups and step t-1's push are in flight. 0 =
  // synchronous (every lookup sees every update before it). Either way the run is
  // deterministic: one thread sends the lookups and pushes, in a fixed order.
  int max_staleness = 0;
  // Runs a step's per-table work (deduplicating each table's ids, pooling's backward) a
  // table to a thread; the results do not depend on its size. Null: one thread. Give the
  // same pool to an in-process collection (embedding::InProcessOptions::pool) so that both
  // share the machine's cores.
  std::shared_ptr<base::ThreadPool> sparse_pool;
  // Called with every progress record (after the line is printed); may be empty.
  std::function<void(const Progress&)> on_progress;
  // What a shard restart (EmbeddingCollection::ShardRestarts) does to a run whose model
  // has CHECKPOINT tables, which went back to their checkpoint on that shard: kResume
  // restores the model's newest checkpoint and Train returns so the caller continues from
  // it (TrainResult::resume_from); kFail ends the run with an error saying so.
  enum class OnShardRestart { kResume, kFail };
  OnShardRestart on_shard_restart = OnShardRestart::kResume;
  // Data-parallel: this trainer is worker data_parallel->rank() of data_parallel->size()
  // training one model (null: it trains alone). Every step, the workers' dense gradients
  // are replaced by their mean before the optimizer step, and each worker's embedding
  // gradients (scaled by 1/N, so N workers at batch B take the step one worker takes at
  // batch N*B) are pushed in a sync group: each shard applies the step once all workers
  // have pushed it. Needs tables on a cluster.
  DataParallel* data_parallel = nullptr;
  // How long a shard waits for the other workers' pushes of a step.
  std::chrono::milliseconds sync_timeout{std::chrono::seconds(20)};
};

struct EvalResult {
  int64_t samples = 0;
  double logloss = 0.0;
  double auc = 0.5;
  bool has_teacher = false;  // synthetic data: the planted model's own quality
  double teacher_logloss = 0.0;
  double teacher_auc = 0.5;
};

// Where a trainer's steps spent their time, in seconds summed over the steps, as the
// training thread sees it: pipelined (max_staleness > 0), lookups and pushes count only
// the time spent waiting for them. `dense` is the dense network's forward and backward
// passes; `grads` the embedding gradients' preparation for the push (deduplicated ids,
// pooling's backward); `allreduce` the data-parallel mean of the dense gradients (waiting
// for the slowest worker included); `optimizer` the dense network's update (on a GPU, only
// queued: it runs on the device while the next step's lookups do, and any wait for it
// lands in the next `dense`).
//
// `sparse_work` is the time the tables' work took wherever it ran: the lookups and pushes
// (on the sparse thread when pipelined, waited for or not) and the embedding gradients.
// `wall` is the steps' own time on the training thread. Synchronous, wall is about
// sparse_work + dense + optimizer; pipelined and overlapped, it nears the larger of the two.
struct StepTimes {
  int64_t steps = 0;
  double lookup = 0, dense = 0, grads = 0, allreduce = 0, push = 0, optimizer = 0;
  double sparse_work = 0, wall = 0;
};

struct TrainResult {
  std::vector<double> losses;  // training loss of every step
  int64_t steps = 0;
  int64_t samples = 0;
  double seconds = 0.0;
  // >= 0: a shard restarted and the model was restored to its checkpoint of this step;
  // call Train again with a source that starts at it.
  int64_t resume_from = -1;
};

// Trains DLRM synchronously: each step looks up the pooled embeddings of its batch (so it
// sees every update of the step before), runs the dense forward and backward, pushes the
// embedding gradients and then steps the dense optimizer. One table per sparse feature,
// named <model>.C1..<model>.Cn. Not thread-safe; one thread drives a Trainer.
class Trainer {
 public:
  Trainer(embedding::EmbeddingCollection* tables, DenseBackend* dense, TrainerOptions options);
  ~Trainer();

  // "<model>.C1".. ("C1".. for model "").
  static std::vector<std::string> TableNames(int num_sparse, const std::string& model = "");
  const std::vector<std::string>& table_names() const { return names_; }

  // Creates the tables from `prototype` (dim must equal the model's emb_dim); table f is
  // named TableNames()[f] and seeded with prototype.seed() + f. Tables that exist already
  // (created by an operator, or by an earlier run) are checked instead (CheckTables).
  // `vocabulary_sizes` (one per table, or empty): each table's fixed vocabulary
  // (TableConfig.vocabulary_size; the ids must already lie in it).
  absl::Status CreateTables(const v1::TableConfig& prototype,
                            const std::vector<int64_t>& vocabulary_sizes = {});

  // The name of the first of this model's tables that exists already, or "" when none does.
  absl::StatusOr<std::string> FirstExistingTable() const;
  // With options.alter_tables: gives the model's tables whose learning rate is not the
  // prototype's the prototype's (after a resume, whose restore brings back the
  // checkpoint's settings), and says how many.
  absl::Status AlterTables(const v1::TableConfig& prototype);
  // The model's tables that hold rows, as "NAME (N rows)" joined by ", "; empty when every
  // table is untouched (new, or created by an operator and never trained).
  absl::StatusOr<std::string> TrainedTables() const;

  // One training step on `batch`; returns its mean loss.
  absl::StatusOr<double> TrainStep(const Batch& batch, int64_t step);

  // What one step of NextStep did.
  struct StepOutcome {
    double loss = 0.0;  // mean training loss of the step
    int samples = 0;
  };
  // Trains the next step from `source` (step number `step`), synchronously or pipelined as
  // options.max_staleness says; nullopt when the source has ended, or when `max_steps`
  // (0 = no limit) steps have been taken. Its push may still be in flight (pipelined) or
  // held for the next lookup to carry (HoldsPushes): Drain() before reading the tables as
  // of this step.
  absl::StatusOr<std::optional<StepOutcome>> NextStep(BatchSource* source, int64_t step,
                                                      int64_t max_steps = 0);
  // Waits until every lookup and push sent has finished; returns the first failure.
  absl::Status Drain();

  // Checks that the tables of `prototype` exist with its dim and optimizer (a resumed run
  // finds them loaded from disk or on the shards).
  absl::Status CheckTables(const v1::TableConfig& prototype) const;

  // Runs steps first_step, first_step + 1, ... until `max_steps` steps are done in all (0 =
  // until the source ends), printing progress, writing metrics and taking checkpoints as
  // options say. `source` yields the batch of step first_step first.
  absl::StatusOr<TrainResult> Train(BatchSource* source, int64_t max_steps, int64_t first_step = 0);

  // A checkpoint after `steps` completed steps: tables and the dense state.
  absl::StatusOr<embedding::CheckpointInfo> Checkpoint(int64_t steps);
  // Restores this model's newest complete checkpoint, its tables and dense state, and
  // returns its step (the steps done, so the next is that one). A newest checkpoint that
  // cannot be restored (a shard lacks it, a file of it is corrupt, its dense state does
  // not read) gives way to the one before it, saying so. NotFound when there is none;
  // FailedPrecondition, with nothing restored, when it holds no dense state or belongs to
  // another run (options.run_signature).
  absl::StatusOr<int64_t> Resume();
  // Resume from checkpoint `step` (-1: the newest) alone.
  absl::StatusOr<int64_t> ResumeFrom(int64_t step);

  // Logloss and exact AUC over `held_out`, without creating rows for unseen ids.
  absl::StatusOr<EvalResult> Evaluate(const Batch& held_out);

  const StepTimes& step_times() const { return times_; }
  // Whether steps hold their push for the next step's lookup to carry: synchronous ones
  // (max_staleness 0), on a collection that FusesPushAndLookup, in no sync group (a
  // group's push goes alone).
  bool HoldsPushes() const;
  // The steps' times when the first kFirstSteps of this trainer's were done (steps 0 before
  // then): a run's first steps create most of its rows, apart from its steady state.
  static constexpr int64_t kFirstSteps = 100;
  const StepTimes& first_step_times() const { return first_times_; }
  // The step of the newest checkpoint this trainer took (or resumed from); -1 for none.
  int64_t last_checkpoint() const { return last_checkpoint_; }

  // Appends one JSON object (already formatted, without newline) to the metrics file.
  void WriteMetrics(const std::string& json);

 private:
  // One step's sparse state: its batch, pooled embeddings, and gradients while they are
  // pushed (max_staleness > 0).
  struct Step;
  class SparseWorker;

  absl::Status LookupAll(const Batch& batch, bool insert_missing);
  // A step's buffers, its embeddings in the dense backend's host memory.
  std::unique_ptr<Step> NewStep() const;
  // Looks up `batch`'s pooled embeddings into *emb (features, size, dim) through `sparse`,
  // the push `push_first` applied first when given.
  absl::Status LookupInto(const Batch& batch, bool insert_missing, HostFloats* emb,
                          SparseStep* sparse, const SparseStep::PushFirst* push_first = nullptr);
  // Pushes the step whose push is held, if one is (before anything reads the tables).
  absl::Status PushHeld();
  // Dense forward and backward on `batch` with embeddings `emb`, then the gradients of
  // each feature's distinct rows into `step`'s buffers (unique ids, grads, pushes).
  absl::StatusOr<double> ForwardBackward(const Batch& batch, const float* emb, Step* step);
  // How this trainer pushes its steps (in its sync group when data-parallel).
  embedding::PushOptions StepPushOptions(const SparseStep& sparse) const;
  // NextStep with max_staleness > 0.
  absl::StatusOr<std::optional<StepOutcome>> PipelinedStep(BatchSource* source, int64_t step,
                                                           int64_t max_steps);
  // Checkpoint(steps) with a progress line and a metrics record.
  absl::Status CheckpointAndReport(int64_t steps);
  // The steps since the last progress line.
  struct ProgressWindow {
    std::chrono::steady_clock::time_point start;
    int64_t samples = 0;
    double loss = 0.0;
    int64_t steps = 0;
  };
  // The progress line and metrics record after `done` steps (`samples` in all), and a new
  // window.
  void ReportProgress(int64_t done, int64_t max_steps, int64_t samples,
                      std::chrono::steady_clock::time_point start, ProgressWindow* window);
  // The dense network after `done` steps, published for serving replicas.
  absl::Status PublishDense(int64_t done);
  // After a shard restart seen at step `step`: the checkpoint step the model was restored
  // to, -1 when no shard restarted or nothing was lost, or the error that ends the run.
  absl::StatusOr<int64_t> HandleShardRestart(int64_t step);
  // Forgets the steps a pipelined run looked up ahead (after a restore).
  void ResetPipeline();
  // Runs `call` on the sparse thread, adding its duration to worker_ns_.
  absl::Status Timed(absl::FunctionRef<absl::Status()> call);

  embedding::EmbeddingCollection* tables_;
  DenseBackend* dense_;
  TrainerOptions options_;
  std::vector<std::string> names_;
  std::ofstream metrics_;
  // Pooled embeddings and their gradients in the dense backend's host memory.
  HostFloats emb_, emb_grad_;
  std::vector<float> logits_;
  SparseStep lookup_;  // LookupAll's: evaluation
  std::unique_ptr<Step> sync_step_;  // the synchronous path's buffers and batch
  // The synchronous step whose push waits for the next lookup (HoldsPushes), its number,
  // and the buffers of the step before it, free again.
  std::unique_ptr<Step> held_, spare_;
  int64_t held_step_ = 0;
  // Pipelined runs: steps looked up (or being), oldest first; steps whose push is in flight.
  std::deque<std::unique_ptr<Step>> ahead_, pushing_;
  std::unique_ptr<SparseWorker> worker_;  // destroyed first: it finishes the calls queued
  int64_t next_lookup_step_ = 0;
  bool source_done_ = false;
  int64_t last_checkpoint_ = -1;
  int64_t last_published_ = -1;
  int64_t restarts_seen_ = 0;  // tables_->ShardRestarts() handled so far
  StepTimes times_;
  StepTimes first_times_;  // times_ after kFirstSteps steps
  // Nanoseconds the sparse thread spent in lookups and pushes (pipelined runs).
  std::atomic<int64_t> worker_ns_{0};
};

}  // namespace tessera::trainer

#endif  // TESSERA_TRAINER_TRAINER_H_
