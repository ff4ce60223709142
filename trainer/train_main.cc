// tessera-train: trains a DLRM ranking model against embedding tables. With no flags it
// runs on synthetic data with a planted teacher, on 4 in-process shards.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/command_line.h"
#include "base/status.h"
#include "client/embedding_client.h"
#include "embedding/collection.h"
#include "embedding/device/device_collection.h"
#include "embedding/inprocess_collection.h"
#include "embedding/optimizer.h"
#include "embedding/storage/durable_collection.h"
#include "embedding/storage/host_checkpoints.h"
#include "observability/logging.h"
#include "observability/metrics.h"
#include "trainer/coordinator_rendezvous.h"
#include "trainer/data_parallel.h"
#include "trainer/dense_backend.h"
#include "trainer/next_step.h"
#include "trainer/resume.h"
#include "trainer/train_data.h"
#include "trainer/train_flags.h"
#include "trainer/train_legs.h"
#include "trainer/trainer.h"

namespace tessera::trainer {
namespace {

// SIGINT and SIGTERM: the first stops training at the end of the step in flight (with a
// checkpoint when --checkpoint_every is set), the second ends the process at once.
std::atomic<bool> stop_requested{false};
volatile sig_atomic_t stop_signal = 0;
std::vector<std::string> command_line;  // as given, for the command that resumes

void OnStopSignal(int sig) {
  if (stop_signal != 0) {
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  stop_signal = sig;
  stop_requested.store(true);
  static const char kMessage[] =
      "tessera-train: stopping at the end of this step (a second signal stops at once)\n";
  (void)!write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
}

void InstallStopHandlers() {
  struct sigaction action = {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

// After a stop by signal: where the model is and how to go on from there.
void ReportStop(int64_t step, int64_t steps, const Trainer& trainer, const std::string& model) {
  std::printf("stopped by %s at step %lld%s\n", stop_signal == SIGINT ? "SIGINT" : "SIGTERM",
              static_cast<long long>(step),
              steps > 0 ? absl::StrCat(" of ", steps).c_str() : "");
  if (trainer.last_checkpoint() < 0) {
    std::printf("no checkpoint was taken: this run cannot be resumed (train with "
                "--checkpoint_every=N and --data_dir=DIR or --coordinator=HOST:PORT to be "
                "able to)\n");
    return;
  }
  std::vector<std::string> args;
  for (const std::string& a : command_line) {
    if (a.rfind("--resume", 0) != 0 && a.rfind("-resume", 0) != 0) args.push_back(a);
  }
  args.push_back("--resume=auto");
  std::printf("newest checkpoint: step %lld of model '%s'\nto go on from it: %s\n",
              static_cast<long long>(trainer.last_checkpoint()), model.c_str(),
              absl::StrJoin(args, " ").c_str());
}

absl::StatusOr<std::unique_ptr<DenseBackend>> MakeDenseBackend(const TrainFlags& f) {
  absl::StatusOr<std::unique_ptr<DenseBackend>> made =
      f.backend == "cuda" ? NewCudaDenseBackend(f.model, f.cuda_device)
                          : NewDenseBackend(f.backend, f.model);
  if (made.ok()) return made;
  std::string context = "--dense_backend=" + f.backend;
  if (f.backend == "cuda") context += " (--dense_backend=cpu runs without a GPU)";
  return Annotate(made.status(), context);
}

// The tables of a run: in this process (in memory or durable) or on a cluster.
struct TrainTables {
  std::unique_ptr<embedding::EmbeddingCollection> tables;
  client::EmbeddingClient* remote = nullptr;  // with --coordinator: tables, as a client
  std::string where;                          // for the model line
};

storage::DurableOptions DurableOptionsOf(const TrainFlags& f) {
  storage::DurableOptions durable;
  durable.data_dir = f.data_dir;
  durable.num_shards = std::max(1, f.shards);
  durable.keep_checkpoints = f.keep_checkpoints;
  durable.pool = f.options.sparse_pool;
  durable.memory_limit = absl::GetFlag(FLAGS_memory_limit);
  durable.log = [](const std::string& line) { std::printf("%s\n", line.c_str()); };
  return durable;
}

absl::StatusOr<TrainTables> MakeTables(const TrainFlags& f) {
  TrainTables out;
  if (!f.coordinator.empty()) {
    client::ClientOptions options = f.client;
    options.pool = f.options.sparse_pool;
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<client::EmbeddingClient> remote,
                             client::EmbeddingClient::Connect(f.coordinator, options));
    out.where = absl::StrCat(remote->num_shards(), " shards via ", f.coordinator, " (",
                             f.client_mode, " client)");
    out.remote = remote.get();
    out.tables = std::move(remote);
  } else if (f.device_tables) {
    TESSERA_ASSIGN_OR_RETURN(out.tables, embedding::device::NewDeviceCollection(f.cuda_device));
    out.where = absl::StrCat("device tables on GPU ", f.cuda_device);
    if (!f.data_dir.empty()) {
      // Checkpoints through the host: the same files a host run writes and reads.
      TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<storage::DurableCollection> store,
                               storage::DurableCollection::Open(DurableOptionsOf(f)));
      out.tables = storage::CheckpointThroughHost(std::move(out.tables), std::move(store));
      out.where += absl::StrCat(", checkpointed through the host in ", f.data_dir);
    }
  } else if (f.data_dir.empty()) {
    embedding::InProcessOptions memory;
    memory.num_shards = f.shards;
    memory.pool = f.options.sparse_pool;
    memory.memory_limit = absl::GetFlag(FLAGS_memory_limit);
    TESSERA_ASSIGN_OR_RETURN(out.tables, embedding::NewInProcessCollection(memory));
    out.where = absl::StrCat(f.shards, " in-process shards");
  } else {
    TESSERA_ASSIGN_OR_RETURN(out.tables, storage::DurableCollection::Open(DurableOptionsOf(f)));
    out.where = absl::StrCat(f.shards, " in-process shards, durable in ", f.data_dir);
  }
  if (f.options.checkpoint_every > 0 || f.resume) {
    // Fail now, not at the first checkpoint, when there is nowhere to keep them.
    TESSERA_ASSIGN_OR_RETURN(embedding::Checkpointing * checkpoints,
                             embedding::CheckpointsOf(*out.tables));
    TESSERA_RETURN_IF_ERROR(checkpoints->ListCheckpoints().status());
  }
  return out;
}

// --metrics_port: the trainer's progress and its tables' sizes (null without the flag).
absl::StatusOr<std::unique_ptr<observability::Metrics>> StartTrainMetrics(
    embedding::EmbeddingCollection* tables, TrainerOptions* options) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<observability::Metrics> metrics,
                           observability::StartMetricsFromFlags("train"));
  if (metrics == nullptr) return metrics;
  auto& registry = metrics->registry();
  auto& rate = observability::NewGauge(registry, "tessera_train_samples_per_second",
                                       "Training throughput over the last progress window");
  auto& loss = observability::NewGauge(registry, "tessera_train_loss",
                                       "Mean training loss over the last progress window");
  auto& steps =
      observability::NewGauge(registry, "tessera_train_step", "Steps trained in this run");
  auto& samples =
      observability::NewGauge(registry, "tessera_train_samples", "Samples trained in this run");
  options->on_progress = [&rate, &loss, &steps, &samples](const Progress& p) {
    rate.Set(p.samples_per_s);
    loss.Set(p.loss);
    steps.Set(static_cast<double>(p.step));
    samples.Set(static_cast<double>(p.samples));
  };
  metrics->Watch(
      [tables](observability::Metrics& m) { m.ReadTables(observability::ReadingsOf(tables)); },
      std::chrono::seconds(5));
  return metrics;
}

// A data-parallel job's workers, met through the coordinator before anything else.
struct Workers {
  std::unique_ptr<CoordinatorRendezvous> kv;
  std::unique_ptr<DataParallel> dp;  // null for a single trainer
};

absl::StatusOr<Workers> JoinWorkers(const TrainFlags& f, client::EmbeddingClient* remote,
                                    TrainerOptions* options) {
  Workers out;
  if (f.num_workers <= 1) return out;
  out.kv = std::make_unique<CoordinatorRendezvous>(remote);
  std::printf("data-parallel: worker %d of %d of model '%s' joining through %s\n", f.worker,
              f.num_workers, options->model.c_str(), f.coordinator.c_str());
  std::fflush(stdout);
  TESSERA_ASSIGN_OR_RETURN(out.dp, DataParallel::Join(out.kv.get(), f.data_parallel));
  std::printf("data-parallel: all %d workers connected (generation %lld)\n", f.num_workers,
              static_cast<long long>(out.dp->generation()));
  options->data_parallel = out.dp.get();
  options->sync_timeout = f.data_parallel.timeout;
  return out;
}

// Creates the model's tables (worker 0) or checks them (the others), resumes from its
// newest checkpoint with --resume and applies --alter_tables. Returns the first step.
absl::StatusOr<int64_t> PrepareTables(Trainer& trainer, const TrainFlags& f, DenseBackend* dense,
                                      DataParallel* dp, const TrainerOptions& options) {
  if (f.worker == 0) {
    // CreateTable of an existing table with the same config is OK (creates are
    // idempotent), so existing tables are looked for first.
    TESSERA_ASSIGN_OR_RETURN(std::string existing, trainer.FirstExistingTable());
    if (!existing.empty() && !f.resume) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table '", existing, "' already exists: model '", options.model,
          "' has tables; pass --resume=auto to continue it, --model=OTHER to train a new "
          "model, or drop its tables first (tessera-cli drop --table=...)"));
    }
    // Creates what is missing (all of it on a first run) and checks what exists (tables
    // an operator created with tessera-cli apply, or an earlier run).
    TESSERA_RETURN_IF_ERROR(trainer.CreateTables(f.table, f.vocabulary));
  }
  if (dp != nullptr) {
    // Worker 0 made the tables; the others check them once it has.
    TESSERA_RETURN_IF_ERROR(Annotate(dp->Barrier(f.data_parallel.rendezvous_timeout),
                                     "waiting for worker 0 to create the model's tables"));
    if (f.worker != 0) TESSERA_RETURN_IF_ERROR(trainer.CheckTables(f.table));
  }
  int64_t first_step = 0;
  if (f.resume) {
    TESSERA_ASSIGN_OR_RETURN(first_step, ResumeOnEveryWorker(trainer, dense, dp, options.model));
  }
  // After the resume: its restore brings back the checkpoint's settings.
  if (options.alter_tables && f.worker == 0) {
    TESSERA_RETURN_IF_ERROR(trainer.AlterTables(f.table));
  }
  return first_step;
}

// What the training legs of a run came to, with what its TSV reader counted.
struct Trained : TrainedLegs {
  int64_t lines_read = 0, bad_lines = 0;  // TSV input
  bool from_file = false;
};

absl::StatusOr<Trained> TrainLegs(Trainer& trainer, TrainData* d, DataParallel* dp,
                                  int64_t steps, int64_t first_step) {
  Trained out;
  TESSERA_ASSIGN_OR_RETURN(static_cast<TrainedLegs&>(out),
                           TrainWithRecovery(trainer, d->make_source, dp, &stop_requested, steps,
                                             first_step, &d->source));
  // The reader belongs to the source: what it counted is read before the source goes.
  out.from_file = d->reader != nullptr;
  out.lines_read = out.from_file ? d->reader->lines_read() : 0;
  out.bad_lines = out.from_file ? d->reader->bad_lines() : 0;
  d->reader = nullptr;
  d->source.reset();
  if (out.bad_lines > 0) {
    std::printf("data: skipped %lld malformed line(s) of %lld read\n",
                static_cast<long long>(out.bad_lines), static_cast<long long>(out.lines_read));
  }
  return out;
}

// The end of a run's training: why it trained no step (an error), or what it trained.
absl::Status ReportTraining(const TrainFlags& f, const Trainer& trainer, const Trained& t,
                            int64_t first_step) {
  if (t.from_file && f.steps > 0 && t.last_step < f.steps) {
    std::printf("data: the input ran out at step %lld of --steps=%lld (%lld lines read, "
                "%d epoch(s)); pass --epochs to go over it again\n",
                static_cast<long long>(t.last_step), static_cast<long long>(f.steps),
                static_cast<long long>(t.lines_read), f.criteo.epochs);
  }
  if (t.result.steps == 0) {
    if (t.from_file) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no training step: ", f.data, " has no valid training line (", t.lines_read,
          " read, ", t.bad_lines, " malformed); check the format (label, ", f.model.num_dense,
          " integers, ", f.model.num_sparse,
          " hex categoricals, tab-separated; plain or gzip)"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "no training step: the run was already at step ", first_step, " of ", f.steps,
        "; pass a larger --steps to train further"));
  }
  const TrainResult& r = t.result;
  std::printf("trained %lld steps, %lld samples in %.1fs (%.0f samples/s)\n",
              static_cast<long long>(r.steps), static_cast<long long>(r.samples), r.seconds,
              r.seconds > 0 ? r.samples / r.seconds : 0.0);
  if (const StepTimes& s = trainer.step_times(); s.steps > 0) {
    const double ms = 1e3 / static_cast<double>(s.steps);
    // Held pushes ride on the next step's lookup: its time is theirs too.
    const bool carried = trainer.HoldsPushes();
    std::printf(
        "per step: lookup%s %.2f ms, dense %.2f ms, embedding grads %.2f ms, "
        "allreduce %.2f ms, push %.2f ms%s, optimizer %.2f ms\n",
        carried ? " (carrying the step before's push)" : "", s.lookup * ms, s.dense * ms,
        s.grads * ms, s.allreduce * ms, s.push * ms, carried ? " (alone)" : "", s.optimizer * ms);
    // Pipelined, the tables' work runs while the dense step does: a step nears the larger.
    std::printf("per step: sparse work %.2f ms, dense %.2f ms, step %.2f ms\n",
                s.sparse_work * ms, (s.dense + s.optimizer) * ms, s.wall * ms);
    // The first steps create most rows: apart from the steady state after them.
    if (const StepTimes& f = trainer.first_step_times(); f.steps > 0 && s.steps > f.steps) {
      const double first = 1e3 / static_cast<double>(f.steps);
      const double after = 1e3 / static_cast<double>(s.steps - f.steps);
      std::printf(
          "per step, first %lld steps: sparse work %.2f ms, dense %.2f ms; after them: "
          "sparse work %.2f ms, dense %.2f ms\n",
          static_cast<long long>(f.steps), f.sparse_work * first, (f.dense + f.optimizer) * first,
          (s.sparse_work - f.sparse_work) * after,
          (s.dense + s.optimizer - f.dense - f.optimizer) * after);
    }
  }
  if (t.replayed > 0) {
    std::printf("(%lld of them trained again after shard restarts sent the model back to its "
                "checkpoint)\n",
                static_cast<long long>(t.replayed));
  }
  return absl::OkStatus();
}

// Data-parallel: every worker's dense model must be the same bits: says so, and checks it.
absl::Status CheckWorkersAgree(DataParallel* dp, DenseBackend* dense, int worker) {
  TESSERA_ASSIGN_OR_RETURN(const uint64_t same, CheckSameDenseModel(dp, dense));
  const double per_step =
      dp->allreduces() > 0 ? 1e3 * dp->allreduce_seconds() / dp->allreduces() : 0.0;
  std::printf(
      "data-parallel: worker %d of %d, dense parameters %016llx on every worker, "
      "allreduce %.3f ms per step (%lld steps)\n",
      worker, dp->size(), static_cast<unsigned long long>(same), per_step,
      static_cast<long long>(dp->allreduces()));
  return absl::OkStatus();
}

// The rows the model's tables hold (feature admission keeps rare ids out of them).
absl::Status ReportRows(const embedding::EmbeddingCollection& tables, const std::string& model,
                        int num_sparse) {
  int64_t rows = 0, bytes = 0;
  for (const std::string& name : Trainer::TableNames(num_sparse, model)) {
    TESSERA_ASSIGN_OR_RETURN(const embedding::TableUsage usage, tables.Usage(name));
    rows += usage.rows;
    bytes += usage.memory_bytes;
  }
  std::printf("tables: %lld rows stored, %.1f MB\n", static_cast<long long>(rows), bytes / 1e6);
  return absl::OkStatus();
}

absl::Status ReportEvaluation(Trainer& trainer, const Batch& held_out, const Trained& t) {
  TESSERA_ASSIGN_OR_RETURN(EvalResult eval, trainer.Evaluate(held_out));
  if (eval.samples == 0) {
    std::printf("held-out: 0 samples (none held out: no logloss or auc)\n");
  } else {
    std::printf("held-out: %lld samples  logloss %.5f  auc %.5f\n",
                static_cast<long long>(eval.samples), eval.logloss, eval.auc);
  }
  std::string teacher_json;
  if (eval.has_teacher) {
    std::printf("teacher:  logloss %.5f  auc %.5f  (auc gap %.5f)\n", eval.teacher_logloss,
                eval.teacher_auc, eval.teacher_auc - eval.auc);
    teacher_json = absl::StrFormat(R"(,"teacher_logloss":%.6f,"teacher_auc":%.6f)",
                                   eval.teacher_logloss, eval.teacher_auc);
  }
  trainer.WriteMetrics(absl::StrFormat(
      R"({"event":"eval","step":%d,"samples":%d,"logloss":%.6f,"auc":%.6f%s,"train_seconds":%.3f})",
      t.last_step, eval.samples, eval.logloss, eval.auc, teacher_json, t.result.seconds));
  return absl::OkStatus();
}

// --publish_dense_every: worker 0 publishes the dense network through the coordinator
// (every worker holds the same one).
absl::StatusOr<std::unique_ptr<DensePublisher>> MakeDensePublisher(const TrainFlags& f,
                                                                   CoordinatorRendezvous* kv,
                                                                   TrainerOptions* options) {
  if (options->publish_dense_every == 0) return nullptr;
  if (kv == nullptr) {
    return absl::InvalidArgumentError(
        "--publish_dense_every publishes through a cluster: give --coordinator=HOST:PORT");
  }
  if (f.worker != 0) {
    options->publish_dense_every = 0;
    return nullptr;
  }
  auto publisher = std::make_unique<DensePublisher>(
      kv, options->model, Trainer::TableNames(f.model.num_sparse, options->model));
  options->dense_publisher = publisher.get();
  return publisher;
}

absl::Status Run() {
  TESSERA_ASSIGN_OR_RETURN(const TrainFlags f, ParseTrainFlags());
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<DenseBackend> dense, MakeDenseBackend(f));
  TESSERA_ASSIGN_OR_RETURN(TrainTables tables, MakeTables(f));
  TrainerOptions options = f.options;
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<observability::Metrics> metrics,
                           StartTrainMetrics(tables.tables.get(), &options));
  TESSERA_ASSIGN_OR_RETURN(Workers workers, JoinWorkers(f, tables.remote, &options));
  DataParallel* dp = workers.dp.get();
  std::unique_ptr<CoordinatorRendezvous> store;
  if (tables.remote != nullptr) store = std::make_unique<CoordinatorRendezvous>(tables.remote);
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<DensePublisher> publisher,
                           MakeDensePublisher(f, store.get(), &options));
  Trainer trainer(tables.tables.get(), dense.get(), options);
  TESSERA_ASSIGN_OR_RETURN(const int64_t first_step,
                           PrepareTables(trainer, f, dense.get(), dp, options));
  TrainData data;
  TESSERA_RETURN_IF_ERROR(f.synthetic ? OpenSyntheticData(f, &data) : OpenFileData(f, &data));
  if (!f.vocabulary.empty()) HashData(f, &data);
  std::printf("model: '%s' (DLRM) on %s, emb_dim %d, tables %s.C1-C%d on %s, optimizer %s, "
              "%d sparse thread(s)\n",
              options.model.c_str(), dense->name().c_str(), f.model.emb_dim,
              options.model.c_str(), f.model.num_sparse, tables.where.c_str(),
              embedding::OptimizerName(f.table.optimizer().type()).c_str(), f.sparse_threads);
  std::fflush(stdout);
  TESSERA_ASSIGN_OR_RETURN(const Trained trained,
                           TrainLegs(trainer, &data, dp, f.steps, first_step));
  if (stop_requested.load()) {
    ReportStop(trained.last_step, f.steps, trainer, options.model);
    return absl::OkStatus();
  }
  TESSERA_RETURN_IF_ERROR(ReportTraining(f, trainer, trained, first_step));
  if (dp != nullptr) TESSERA_RETURN_IF_ERROR(CheckWorkersAgree(dp, dense.get(), f.worker));
  TESSERA_RETURN_IF_ERROR(ReportRows(*tables.tables, options.model, f.model.num_sparse));
  return ReportEvaluation(trainer, data.held_out, trained);
}

}  // namespace

}  // namespace tessera::trainer

int main(int argc, char** argv) {
  // A bare --resume (a string flag now: auto / false) means --resume=auto.
  std::vector<std::string> args(argv, argv + argc);
  std::vector<char*> argp;
  for (std::string& a : args) {
    if (a == "--resume" || a == "-resume") a = "--resume=auto";
    argp.push_back(a.data());
  }
  tessera::base::ParseCommandLine(static_cast<int>(argp.size()), argp.data(), "tessera-train",
                                   "Trains a DLRM ranking model with Tessera embedding tables.\n"
      "  tessera-train                       synthetic data, 4 in-process shards\n"
      "  tessera-train --data=train.tsv      Criteo-format TSV\n"
      "  tessera-train --coordinator=HOST:PORT --model=NAME --resume=auto");
  absl::Status s = tessera::observability::ConfigureLoggingFromFlags("tessera-train");
  tessera::trainer::command_line.assign(argv, argv + argc);
  tessera::trainer::InstallStopHandlers();
  if (s.ok()) s = tessera::trainer::Run();
  if (!s.ok()) {
    std::cerr << "tessera-train: " << s << "\n";
    const bool checkpoints =
        absl::GetFlag(FLAGS_checkpoint_every) > 0 || absl::GetFlag(FLAGS_resume) != "false";
    const std::string next =
        tessera::trainer::NextStepAfter(s, checkpoints, absl::GetFlag(FLAGS_model));
    if (!next.empty()) std::cerr << "tessera-train: next: " << next << "\n";
    return 1;
  }
  // Stopped by a signal: the shell's code for it, after the orderly stop.
  if (tessera::trainer::stop_signal != 0) return 128 + tessera::trainer::stop_signal;
  return 0;
}
