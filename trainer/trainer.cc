#include "trainer/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "embedding/batch_ops.h"
#include "embedding/optimizer.h"
#include "embedding/table_config.h"
#include "trainer/metrics.h"

namespace tessera::trainer {
namespace {

// Adds the seconds from its construction (or the last Lap) to a total at each Lap.
class Stopwatch {
 public:
  Stopwatch() : last_(std::chrono::steady_clock::now()) {}
  void Lap(double* total) {
    const auto now = std::chrono::steady_clock::now();
    *total += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  std::chrono::steady_clock::time_point last_;
};

// How long data-parallel workers wait for worker 0's checkpoint (as long as a client
// waits for a cluster checkpoint).
constexpr std::chrono::milliseconds kCheckpointWait = std::chrono::minutes(30);

}  // namespace

struct Trainer::Step {
  Batch batch;
  HostFloats emb;     // (features, size, dim)
  SparseStep sparse;  // its lookup, then its embedding gradients
  int64_t lookup_ticket = -1;
  int64_t push_ticket = -1;
};

// Runs the sparse calls of a pipelined run on one thread, in the order they are submitted
// (so lookups and pushes reach the tables in a fixed order, and runs replay exactly).
// After a failure the later calls are skipped and report it.
class Trainer::SparseWorker {
 public:
  SparseWorker() : thread_([this] { Run(); }) {}
  ~SparseWorker() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  // Queues `call`; returns its ticket for Wait.
  int64_t Submit(std::function<absl::Status()> call) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(call));
    return submitted_++;
  }

  // Waits until call `ticket` has run; OK unless it or an earlier call failed.
  absl::Status Wait(int64_t ticket) {
    absl::MutexLock lock(&mu_);
    const Reached reached{this, ticket};
    mu_.Await(absl::Condition(&reached, &Reached::Done));
    return failure_;
  }

 private:
  struct Reached {
    const SparseWorker* worker;
    int64_t ticket;
    bool Done() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return worker->finished_ > ticket; }
  };

  // Called by mu_.Await, which holds mu_; the analysis cannot see through the Condition.
  bool HasWork() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_ || !queue_.empty(); }

  void Run() {
    absl::MutexLock lock(&mu_);
    while (true) {
      mu_.Await(absl::Condition(this, &SparseWorker::HasWork));
      if (queue_.empty()) return;
      std::function<absl::Status()> call = std::move(queue_.front());
      queue_.pop_front();
      const bool skip = !failure_.ok();
      mu_.Unlock();
      absl::Status s = skip ? absl::OkStatus() : call();
      mu_.Lock();
      if (!s.ok() && failure_.ok()) failure_ = s;
      ++finished_;
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<absl::Status()>> queue_ ABSL_GUARDED_BY(mu_);
  int64_t submitted_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t finished_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

Trainer::Trainer(embedding::EmbeddingCollection* tables, DenseBackend* dense,
                 TrainerOptions options)
    : tables_(tables),
      dense_(dense),
      options_(std::move(options)),
      emb_(dense_->NewHostFloats()),
      emb_grad_(dense_->NewHostFloats()) {
  names_ = TableNames(dense_->config().num_sparse, options_.model);
  if (options_.sparse_pool == nullptr) {
    options_.sparse_pool = std::make_shared<base::ThreadPool>(1);
  }
  restarts_seen_ = tables_->ShardRestarts();
  if (!options_.metrics_out.empty()) {
    metrics_.open(options_.metrics_out, std::ios::out | std::ios::trunc);
    if (!metrics_.is_open()) {
      std::cerr << "warning: cannot open metrics file '" << options_.metrics_out << "'\n";
    }
  }
}

Trainer::~Trainer() = default;  // the worker (if any) finishes its queue first

std::vector<std::string> Trainer::TableNames(int num_sparse, const std::string& model) {
  std::vector<std::string> names;
  const std::string prefix = model.empty() ? "" : absl::StrCat(model, ".");
  for (int f = 0; f < num_sparse; ++f) names.push_back(absl::StrCat(prefix, "C", f + 1));
  return names;
}

absl::Status Trainer::CreateTables(const v1::TableConfig& prototype,
                                   const std::vector<int64_t>& vocabulary_sizes) {
  if (prototype.dim() != dense_->config().emb_dim) {
    return absl::InvalidArgumentError(absl::StrCat("table dim ", prototype.dim(),
                                                   " differs from the model's emb_dim ",
                                                   dense_->config().emb_dim));
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<v1::TableConfig> existing, tables_->ListTables());
  for (size_t f = 0; f < names_.size(); ++f) {
    const bool exists =
        std::any_of(existing.begin(), existing.end(),
                    [&](const v1::TableConfig& t) { return t.name() == names_[f]; });
    if (exists) continue;
    v1::TableConfig c = prototype;
    c.set_name(names_[f]);
    c.set_seed(prototype.seed() + f);
    if (f < vocabulary_sizes.size()) c.set_vocabulary_size(vocabulary_sizes[f]);
    TESSERA_RETURN_IF_ERROR(tables_->CreateTable(c));
  }
  return CheckTables(prototype);
}

absl::StatusOr<std::string> Trainer::FirstExistingTable() const {
  TESSERA_ASSIGN_OR_RETURN(std::vector<v1::TableConfig> tables, tables_->ListTables());
  for (const std::string& name : names_) {
    for (const auto& t : tables) {
      if (t.name() == name) return name;
    }
  }
  return std::string();
}

absl::StatusOr<std::string> Trainer::TrainedTables() const {
  std::vector<std::string> trained;
  for (const std::string& name : names_) {
    absl::StatusOr<embedding::TableUsage> usage = tables_->Usage(name);
    if (absl::IsNotFound(usage.status())) continue;
    TESSERA_RETURN_IF_ERROR(usage.status());
    if (usage->rows > 0) trained.push_back(absl::StrCat(name, " (", usage->rows, " rows)"));
  }
  return absl::StrJoin(trained, ", ");
}

namespace {

// What a run's flags set of a table's config; the rest (seeds, row budgets, eviction,
// durability) is the table creator's to choose.
v1::TableConfig RunSettings(const v1::TableConfig& c) {
  v1::TableConfig out;
  out.set_dim(c.dim());
  out.set_dtype(c.dtype());
  out.mutable_optimizer()->set_type(c.optimizer().type());
  out.mutable_optimizer()->set_learning_rate(c.optimizer().has_learning_rate()
                                                 ? c.optimizer().learning_rate()
                                                 : embedding::OptimizerParams{}.learning_rate);
  if (c.initializer().has_scale()) out.mutable_initializer()->set_scale(c.initializer().scale());
  return out;
}

}  // namespace

absl::Status Trainer::CheckTables(const v1::TableConfig& prototype) const {
  TESSERA_ASSIGN_OR_RETURN(std::vector<v1::TableConfig> tables, tables_->ListTables());
  for (const std::string& name : names_) {
    auto it = std::find_if(tables.begin(), tables.end(),
                           [&](const v1::TableConfig& t) { return t.name() == name; });
    if (it == tables.end()) {
      return absl::FailedPreconditionError(absl::StrCat("table '", name, "' is missing"));
    }
    const std::vector<std::string> differences =
        embedding::TableConfigDifferences(RunSettings(*it), RunSettings(prototype));
    if (differences.empty()) continue;
    // The learning rate alone can change on existing rows; the rest cannot.
    const bool only_lr =
        differences.size() == 1 && absl::StartsWith(differences[0], "optimizer.learning_rate ");
    if (only_lr && options_.alter_tables) continue;  // AlterTables, once resumed
    return absl::FailedPreconditionError(absl::StrCat(
        "table '", name,
        "' exists with another config than this run's: ", absl::StrJoin(differences, "; "),
        only_lr ? absl::StrCat(". Pass --alter_tables to give the model's tables this run's "
                               "learning rate (by hand: tessera-cli alter --table=",
                               name, " --lr=...), or the table's --lr to train on as it is")
                : ". Pass the table's settings to train on with it as it is, or train another "
                  "--model"));
  }
  return absl::OkStatus();
}

absl::Status Trainer::AlterTables(const v1::TableConfig& prototype) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<v1::TableConfig> tables, tables_->ListTables());
  const float lr = prototype.optimizer().learning_rate();
  int altered = 0;
  for (const v1::TableConfig& t : tables) {
    if (std::find(names_.begin(), names_.end(), t.name()) == names_.end() ||
        RunSettings(t).optimizer().learning_rate() == lr) {
      continue;
    }
    v1::OptimizerConfig change;
    change.set_learning_rate(lr);
    TESSERA_RETURN_IF_ERROR(tables_->AlterTable(t.name(), change).status());
    ++altered;
  }
  if (altered > 0 && options_.print_progress) {
    std::printf("tables: the learning rate of %d table(s) is now %g (--alter_tables)\n", altered,
                lr);
  }
  return absl::OkStatus();
}

absl::StatusOr<embedding::CheckpointInfo> Trainer::Checkpoint(int64_t steps) {
  embedding::Attachments attachments;
  attachments["dense"] = dense_->SaveState();
  attachments["run"] = options_.run_signature;
  // What a serving replica of this checkpoint scores with (tessera-serve --checkpoint).
  attachments[kServingAttachment] = DenseSnapshotOf(steps, *dense_, names_).SerializeAsString();
  embedding::CheckpointOptions where;
  where.model = options_.model;
  TESSERA_ASSIGN_OR_RETURN(embedding::Checkpointing * checkpoints,
                           embedding::CheckpointsOf(*tables_));
  return checkpoints->Checkpoint(steps, attachments, where);
}

absl::Status Trainer::CheckpointAndReport(int64_t steps) {
  DataParallel* dp = options_.data_parallel;
  if (dp != nullptr && dp->rank() != 0) {
    // Worker 0 checkpoints the tables and the dense state (the same on every worker);
    // the others wait for it before their next step.
    TESSERA_RETURN_IF_ERROR(
        Annotate(dp->Barrier(kCheckpointWait), "waiting for worker 0's checkpoint"));
    last_checkpoint_ = steps;
    return absl::OkStatus();
  }
  TESSERA_ASSIGN_OR_RETURN(embedding::CheckpointInfo info, Checkpoint(steps));
  if (options_.print_progress) {
    std::printf("checkpoint %lld: %lld rows, %.1f MB, %.2fs\n", static_cast<long long>(steps),
                static_cast<long long>(info.rows), info.bytes / 1e6, info.seconds);
    std::fflush(stdout);
  }
  WriteMetrics(
      absl::StrFormat(R"({"event":"checkpoint","step":%d,"rows":%d,"bytes":%d,"seconds":%.3f})",
                      steps, info.rows, info.bytes, info.seconds));
  last_checkpoint_ = steps;
  if (dp != nullptr) TESSERA_RETURN_IF_ERROR(dp->Barrier(kCheckpointWait));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Trainer::ResumeFrom(int64_t step) {
  embedding::RestoreOptions checks;
  checks.model = options_.model;
  // Checked before anything is restored: a checkpoint without dense state (an operator's)
  // or of another run is refused with every table as it was.
  checks.required_attachments = {"dense"};
  checks.expected_attachments["run"] = options_.run_signature;
  embedding::Attachments attachments;
  TESSERA_ASSIGN_OR_RETURN(embedding::Checkpointing * checkpoints,
                           embedding::CheckpointsOf(*tables_));
  TESSERA_ASSIGN_OR_RETURN(embedding::CheckpointInfo info,
                           checkpoints->Restore(step, &attachments, checks));
  TESSERA_RETURN_IF_ERROR(Annotate(dense_->LoadState(attachments["dense"]),
                                   absl::StrCat("the dense state of checkpoint ", info.step)));
  last_checkpoint_ = info.step;
  return info.step;
}

absl::StatusOr<int64_t> Trainer::Resume() {
  absl::StatusOr<int64_t> newest = ResumeFrom(-1);
  // Refused for what this run is (another network, no dense state), or a cluster that is
  // down: an older checkpoint would not fare better.
  if (newest.ok() || absl::IsFailedPrecondition(newest.status()) ||
      absl::IsUnavailable(newest.status()) || absl::IsDeadlineExceeded(newest.status())) {
    return newest;
  }
  // The newest checkpoint cannot be restored (a shard lacks it, a file of it is corrupt,
  // its dense state does not read): the one before it, and so on.
  embedding::Checkpointing* checkpoints = tables_->checkpointing();
  if (checkpoints == nullptr) return newest;
  absl::StatusOr<std::vector<embedding::CheckpointInfo>> list = checkpoints->ListCheckpoints();
  if (!list.ok()) return newest;
  std::vector<int64_t> steps;
  for (const embedding::CheckpointInfo& c : *list) {
    if (c.model == options_.model) steps.push_back(c.step);
  }
  std::sort(steps.rbegin(), steps.rend());
  for (size_t i = 1; i < steps.size(); ++i) {
    std::printf(
        "resume: checkpoint %lld of model '%s' cannot be restored (%s); trying the one "
        "before it, %lld\n",
        static_cast<long long>(steps[i - 1]), options_.model.c_str(),
        newest.status().ToString().c_str(), static_cast<long long>(steps[i]));
    std::fflush(stdout);
    newest = ResumeFrom(steps[i]);
    if (newest.ok() || absl::IsFailedPrecondition(newest.status())) return newest;
  }
  return newest;
}

void Trainer::WriteMetrics(const std::string& json) {
  if (metrics_.is_open()) metrics_ << json << "\n" << std::flush;
}

absl::Status Trainer::LookupAll(const Batch& batch, bool insert_missing) {
  return LookupInto(batch, insert_missing, &emb_, &lookup_);
}

std::unique_ptr<Trainer::Step> Trainer::NewStep() const {
  auto step = std::make_unique<Step>();
  step->emb = dense_->NewHostFloats();
  return step;
}

absl::Status Trainer::LookupInto(const Batch& batch, bool insert_missing, HostFloats* emb,
                                 SparseStep* sparse, const SparseStep::PushFirst* push_first) {
  const int d = dense_->config().emb_dim;
  emb->resize(static_cast<size_t>(batch.size) * d * names_.size());
  return sparse->Lookup(*tables_, names_, batch, d, insert_missing, absl::MakeSpan(*emb),
                        push_first);
}

bool Trainer::HoldsPushes() const {
  const DataParallel* dp = options_.data_parallel;
  return options_.max_staleness == 0 && tables_->FusesPushAndLookup() &&
         (dp == nullptr || dp->size() <= 1);
}

absl::Status Trainer::PushHeld() {
  if (held_ == nullptr) return absl::OkStatus();
  Stopwatch clock;
  std::unique_ptr<Step> held = std::move(held_);
  absl::Status s =
      tables_->PushBatch(held->sparse.pushes(), held_step_, StepPushOptions(held->sparse));
  clock.Lap(&times_.push);
  spare_ = std::move(held);
  return s;
}

absl::StatusOr<double> Trainer::ForwardBackward(const Batch& batch, const float* emb, Step* step) {
  const int d = dense_->config().emb_dim;
  const int nf = static_cast<int>(names_.size());
  logits_.resize(batch.size);
  TESSERA_RETURN_IF_ERROR(dense_->Forward(batch.size, batch.dense.data(), emb, logits_.data()));
  const size_t block = static_cast<size_t>(batch.size) * d;
  emb_grad_.resize(block * nf);
  TESSERA_ASSIGN_OR_RETURN(double loss, dense_->Backward(batch.labels.data(), emb_grad_.data()));
  if (DataParallel* dp = options_.data_parallel; dp != nullptr && dp->size() > 1) {
    // The mean over the workers' batches: dense gradients averaged here, embedding
    // gradients scaled so that the shards' sum over workers is their mean.
    const double before = dp->allreduce_seconds();
    TESSERA_RETURN_IF_ERROR(dp->AllreduceMean(dense_->MutableGradients()));
    times_.allreduce += dp->allreduce_seconds() - before;
    const float scale = 1.0f / static_cast<float>(dp->size());
    for (float& g : emb_grad_) g *= scale;
  }
  Stopwatch grads;
  step->sparse.Gradients(names_, batch, d, emb_grad_.data(), *options_.sparse_pool);
  grads.Lap(&times_.grads);
  return loss;
}

embedding::PushOptions Trainer::StepPushOptions(const SparseStep& sparse) const {
  embedding::PushOptions push;
  push.after_lookup = sparse.after_lookup();
  if (const DataParallel* dp = options_.data_parallel; dp != nullptr && dp->size() > 1) {
    // The generation keeps a restarted job's steps apart from those of its last attempt.
    push.sync.job = absl::StrCat(options_.model, "#", dp->generation());
    push.sync.worker = dp->rank();
    push.sync.workers = dp->size();
    push.sync.timeout = options_.sync_timeout;
  }
  return push;
}

absl::StatusOr<double> Trainer::TrainStep(const Batch& batch, int64_t step) {
  if (sync_step_ == nullptr) sync_step_ = NewStep();
  const StepTimes before = times_;
  Stopwatch clock;
  // Through the step's own SparseStep, whose plans its gradients and push then reuse; the
  // step before's push, when held, rides on it (applied first: the same values as apart).
  if (held_ != nullptr) {
    std::unique_ptr<Step> held = std::move(held_);
    const SparseStep::PushFirst first{held->sparse.pushes(), held_step_,
                                      StepPushOptions(held->sparse)};
    absl::Status looked =
        LookupInto(batch, /*insert_missing=*/true, &emb_, &sync_step_->sparse, &first);
    spare_ = std::move(held);
    TESSERA_RETURN_IF_ERROR(looked);
  } else {
    TESSERA_RETURN_IF_ERROR(LookupInto(batch, /*insert_missing=*/true, &emb_, &sync_step_->sparse));
  }
  clock.Lap(&times_.lookup);
  const double apart = times_.allreduce + times_.grads;
  TESSERA_ASSIGN_OR_RETURN(double loss, ForwardBackward(batch, emb_.data(), sync_step_.get()));
  clock.Lap(&times_.dense);
  times_.dense -= times_.allreduce + times_.grads - apart;  // counted apart
  if (HoldsPushes()) {
    // Sent with the next step's lookup (one round trip for both), or by PushHeld before
    // anything else reads the tables; the next batch goes into other buffers.
    held_ = std::move(sync_step_);
    held_step_ = step;
    sync_step_ = spare_ != nullptr ? std::move(spare_) : NewStep();
  } else {
    TESSERA_RETURN_IF_ERROR(
        tables_->PushBatch(sync_step_->sparse.pushes(), step, StepPushOptions(sync_step_->sparse)));
  }
  clock.Lap(&times_.push);
  dense_->ApplyGradients();
  clock.Lap(&times_.optimizer);
  ++times_.steps;
  times_.sparse_work +=
      (times_.lookup - before.lookup) + (times_.grads - before.grads) + (times_.push - before.push);
  times_.wall += (times_.lookup - before.lookup) + (times_.dense - before.dense) +
                 (times_.grads - before.grads) + (times_.allreduce - before.allreduce) +
                 (times_.push - before.push) + (times_.optimizer - before.optimizer);
  if (times_.steps == kFirstSteps) first_times_ = times_;
  return loss;
}

absl::StatusOr<std::optional<Trainer::StepOutcome>> Trainer::NextStep(BatchSource* source,
                                                                      int64_t step,
                                                                      int64_t max_steps) {
  if (options_.max_staleness < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_staleness must be >= 0, got ", options_.max_staleness));
  }
  if (options_.max_staleness > 0) return PipelinedStep(source, step, max_steps);
  if (max_steps > 0 && step >= max_steps) return std::optional<StepOutcome>();
  if (sync_step_ == nullptr) sync_step_ = NewStep();
  Batch& batch = sync_step_->batch;
  TESSERA_ASSIGN_OR_RETURN(bool more, source->Next(&batch));
  if (!more) return std::optional<StepOutcome>();
  TESSERA_ASSIGN_OR_RETURN(double loss, TrainStep(batch, step));
  return std::optional<StepOutcome>(StepOutcome{loss, batch.size});
}

absl::StatusOr<std::optional<Trainer::StepOutcome>> Trainer::PipelinedStep(BatchSource* source,
                                                                           int64_t step,
                                                                           int64_t max_steps) {
  if (worker_ == nullptr) {
    worker_ = std::make_unique<SparseWorker>();
    next_lookup_step_ = step;
  }
  const size_t depth = static_cast<size_t>(options_.max_staleness) + 1;
  // Lookups of steps up to t+K go out now, before step t's push: they miss at most the
  // updates of the K steps before them.
  while (ahead_.size() < depth && !source_done_ &&
         (max_steps == 0 || next_lookup_step_ < max_steps)) {
    auto next = NewStep();
    TESSERA_ASSIGN_OR_RETURN(bool more, source->Next(&next->batch));
    if (!more) {
      source_done_ = true;
      break;
    }
    Step* p = next.get();
    p->lookup_ticket = worker_->Submit([this, p] {
      return Timed(
          [&] { return LookupInto(p->batch, /*insert_missing=*/true, &p->emb, &p->sparse); });
    });
    ahead_.push_back(std::move(next));
    ++next_lookup_step_;
  }
  if (ahead_.empty()) return std::optional<StepOutcome>();
  Step* s = ahead_.front().get();
  const auto started = std::chrono::steady_clock::now();
  Stopwatch clock;
  TESSERA_RETURN_IF_ERROR(worker_->Wait(s->lookup_ticket));
  clock.Lap(&times_.lookup);
  const double apart = times_.allreduce + times_.grads;
  TESSERA_ASSIGN_OR_RETURN(double loss, ForwardBackward(s->batch, s->emb.data(), s));
  clock.Lap(&times_.dense);
  times_.dense -= times_.allreduce + times_.grads - apart;  // counted apart
  s->push_ticket = worker_->Submit([this, s, step] {
    return Timed(
        [&] { return tables_->PushBatch(s->sparse.pushes(), step, StepPushOptions(s->sparse)); });
  });
  dense_->ApplyGradients();  // while the push is on its way
  clock.Lap(&times_.optimizer);
  pushing_.push_back(std::move(ahead_.front()));
  ahead_.pop_front();
  while (pushing_.size() > static_cast<size_t>(options_.max_staleness)) {
    TESSERA_RETURN_IF_ERROR(worker_->Wait(pushing_.front()->push_ticket));
    pushing_.pop_front();
  }
  clock.Lap(&times_.push);
  ++times_.steps;
  times_.sparse_work = static_cast<double>(worker_ns_.load()) / 1e9 + times_.grads;
  times_.wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (times_.steps == kFirstSteps) first_times_ = times_;
  return std::optional<StepOutcome>(StepOutcome{loss, s->batch.size});
}

absl::Status Trainer::Timed(absl::FunctionRef<absl::Status()> call) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = call();
  worker_ns_.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count());
  return s;
}

void Trainer::ResetPipeline() {
  held_.reset();  // of a step the restore undid (Drain pushed it before)
  ahead_.clear();
  pushing_.clear();
  worker_.reset();
  source_done_ = false;
}

absl::StatusOr<int64_t> Trainer::HandleShardRestart(int64_t step) {
  const int64_t restarts = tables_->ShardRestarts();
  if (restarts == restarts_seen_) return -1;
  restarts_seen_ = restarts;
  // Whatever is in flight finishes first (on the restarted shard too: it answers again).
  TESSERA_RETURN_IF_ERROR(Drain());
  TESSERA_ASSIGN_OR_RETURN(std::vector<v1::TableConfig> tables, tables_->ListTables());
  bool lost = false;
  for (const auto& t : tables) {
    lost |= std::find(names_.begin(), names_.end(), t.name()) != names_.end() &&
            t.durability() == v1::CHECKPOINT;
  }
  if (!lost) {
    if (options_.print_progress) {
      std::printf(
          "step %lld: a shard restarted; this model's tables are write-through, so "
          "nothing acknowledged was lost\n",
          static_cast<long long>(step));
    }
    return -1;
  }
  const std::string what = absl::StrCat(
      "a shard restarted at step ", step,
      " and its CHECKPOINT tables went back to their newest checkpoint, losing this model's "
      "updates since");
  if (options_.data_parallel != nullptr && options_.data_parallel->size() > 1) {
    // Going back alone would leave the other workers' copies of the model behind.
    return absl::AbortedError(
        absl::StrCat(what,
                     "; run every worker again with --resume=auto to continue from the model's "
                     "newest checkpoint"));
  }
  if (options_.on_shard_restart == TrainerOptions::OnShardRestart::kFail) {
    return absl::AbortedError(absl::StrCat(
        what, "; run again with --resume=auto to continue from the model's newest checkpoint"));
  }
  absl::StatusOr<int64_t> back = Resume();
  if (absl::IsNotFound(back.status())) {
    return absl::AbortedError(absl::StrCat(
        what, ", and model '", options_.model,
        "' has no checkpoint to go back to; drop its tables (tessera-cli drop --model=",
        options_.model, ") and run again with --checkpoint_every"));
  }
  TESSERA_RETURN_IF_ERROR(Annotate(back.status(), what));
  ResetPipeline();
  WriteMetrics(
      absl::StrFormat(R"({"event":"shard_restart","step":%d,"resumed_from":%d})", step, *back));
  if (options_.print_progress) {
    std::printf("%s: model '%s' restored to its checkpoint %lld; training again from there\n",
                what.c_str(), options_.model.c_str(), static_cast<long long>(*back));
    std::fflush(stdout);
  }
  return *back;
}

absl::Status Trainer::Drain() {
  TESSERA_RETURN_IF_ERROR(PushHeld());
  if (worker_ == nullptr) return absl::OkStatus();
  absl::Status s;
  for (auto* queue : {&pushing_, &ahead_}) {
    for (auto& step : *queue) {
      const int64_t last = std::max(step->lookup_ticket, step->push_ticket);
      if (last >= 0 && s.ok()) s = worker_->Wait(last);
    }
  }
  pushing_.clear();
  return s;
}

void Trainer::ReportProgress(int64_t done, int64_t max_steps, int64_t samples,
                             std::chrono::steady_clock::time_point start, ProgressWindow* window) {
  const auto now = std::chrono::steady_clock::now();
  const double window_s = std::chrono::duration<double>(now - window->start).count();
  const double total_s = std::chrono::duration<double>(now - start).count();
  const double rate = window_s > 0 ? window->samples / window_s : 0.0;
  const double mean_loss = window->loss / window->steps;
  if (options_.print_progress) {
    std::string total = max_steps > 0 ? absl::StrCat("/", max_steps) : "";
    std::printf("step %lld%s  samples/s %.0f  loss %.5f  elapsed %.1fs\n",
                static_cast<long long>(done), total.c_str(), rate, mean_loss, total_s);
    std::fflush(stdout);
  }
  WriteMetrics(absl::StrFormat(R"({"event":"train","step":%d,"samples":%d,)"
                               R"("samples_per_s":%.1f,"loss":%.6f,"elapsed_s":%.3f})",
                               done, samples, rate, mean_loss, total_s));
  if (options_.on_progress) {
    options_.on_progress(Progress{done, samples, rate, mean_loss, total_s});
  }
  *window = ProgressWindow{now};
}

absl::Status Trainer::PublishDense(int64_t done) {
  if (options_.dense_publisher == nullptr) {
    return absl::FailedPreconditionError(
        "publish_dense_every is set but nothing to publish through (a cluster's coordinator)");
  }
  // The rows of the steps done are on the shards before the network of those steps.
  TESSERA_RETURN_IF_ERROR(PushHeld());
  TESSERA_RETURN_IF_ERROR(Annotate(options_.dense_publisher->Publish(done, *dense_),
                                   absl::StrCat("publishing the dense network of step ", done)));
  last_published_ = done;
  return absl::OkStatus();
}

absl::StatusOr<TrainResult> Trainer::Train(BatchSource* source, int64_t max_steps,
                                           int64_t first_step) {
  TrainResult result;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  ProgressWindow window{start};
  int64_t done = first_step;  // steps completed, counting those before a resume
  int64_t checkpointed = -1;
  // True when a shard restart sent the model back to a checkpoint: `result` is then what
  // Train returns, resume_from saying where to go on.
  auto sent_back = [&]() -> absl::StatusOr<bool> {
    TESSERA_ASSIGN_OR_RETURN(result.resume_from, HandleShardRestart(done));
    if (result.resume_from < 0) return false;
    result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return true;
  };
  while (true) {
    TESSERA_ASSIGN_OR_RETURN(std::optional<StepOutcome> next, NextStep(source, done, max_steps));
    if (!next.has_value()) break;
    const double loss = next->loss;
    const int samples = next->samples;
    if (!std::isfinite(loss)) {
      return absl::InternalError(absl::StrCat("training loss became ", loss, " at step ", done,
                                              "; lower the learning rates"));
    }
    result.losses.push_back(loss);
    ++result.steps;
    ++done;
    result.samples += samples;
    window.samples += samples;
    window.loss += loss;
    ++window.steps;
    const bool last = max_steps > 0 && done == max_steps;
    if (options_.log_every > 0 && (done % options_.log_every == 0 || last)) {
      ReportProgress(done, max_steps, result.samples, start, &window);
    }
    if (options_.publish_dense_every > 0 && (done % options_.publish_dense_every == 0 || last)) {
      TESSERA_RETURN_IF_ERROR(PublishDense(done));
    }
    TESSERA_ASSIGN_OR_RETURN(bool back, sent_back());
    if (back) return result;
    if (options_.checkpoint_every > 0 && (done % options_.checkpoint_every == 0 || last)) {
      TESSERA_RETURN_IF_ERROR(Drain());  // every push of the steps done is applied
      // A restart seen while draining: the checkpoint would hold the lost updates' gap.
      TESSERA_ASSIGN_OR_RETURN(bool drained_back, sent_back());
      if (drained_back) return result;
      TESSERA_RETURN_IF_ERROR(CheckpointAndReport(done));
      checkpointed = done;
    }
  }
  TESSERA_RETURN_IF_ERROR(Drain());
  TESSERA_ASSIGN_OR_RETURN(bool back, sent_back());
  if (back) return result;
  // A source that ran out before max_steps: the last steps are checkpointed (and
  // published) too.
  if (options_.checkpoint_every > 0 && result.steps > 0 && checkpointed != done) {
    TESSERA_RETURN_IF_ERROR(CheckpointAndReport(done));
  }
  if (options_.publish_dense_every > 0 && result.steps > 0 && last_published_ != done) {
    TESSERA_RETURN_IF_ERROR(PublishDense(done));
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

absl::StatusOr<EvalResult> Trainer::Evaluate(const Batch& held_out) {
  TESSERA_RETURN_IF_ERROR(PushHeld());  // the last step's rows, as trained
  EvalResult r;
  r.samples = held_out.size;
  if (held_out.size == 0) return r;
  std::vector<float> probs;
  probs.reserve(held_out.size);
  Batch part;
  for (int begin = 0; begin < held_out.size; begin += options_.eval_batch) {
    const int end = std::min(held_out.size, begin + options_.eval_batch);
    part.Reset(static_cast<int>(names_.size()));
    part.AppendRange(held_out, begin, end);
    TESSERA_RETURN_IF_ERROR(LookupAll(part, /*insert_missing=*/false));
    logits_.resize(part.size);
    TESSERA_RETURN_IF_ERROR(
        dense_->Forward(part.size, part.dense.data(), emb_.data(), logits_.data()));
    for (float x : logits_) probs.push_back(1.0f / (1.0f + std::exp(-x)));
  }
  r.logloss = LogLoss(probs, held_out.labels);
  r.auc = ExactAuc(probs, held_out.labels);
  if (!held_out.teacher_probability.empty()) {
    r.has_teacher = true;
    r.teacher_logloss = LogLoss(held_out.teacher_probability, held_out.labels);
    r.teacher_auc = ExactAuc(held_out.teacher_probability, held_out.labels);
  }
  return r;
}

}  // namespace tessera::trainer
