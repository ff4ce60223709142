// tessera-train: trains a DLRM ranking model against embedding tables. With no flags it
// runs on synthetic data with a planted teacher, on 4 in-process shards.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "client/command_line.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/embedding_client.h"
#include "client/security_flags.h"
#include "embedding/collection.h"
#include "embedding/dtype.h"
#include "embedding/optimizer.h"
#include "embedding/status.h"
#include "embedding/storage/durable_collection.h"
#include "server/logging.h"
#include "server/metrics.h"
#include "trainer/coordinator_rendezvous.h"
#include "trainer/criteo_reader.h"
#include "trainer/data_parallel.h"
#include "trainer/dense_backend.h"
#include "trainer/input_pipeline.h"
#include "trainer/synthetic.h"
#include "trainer/trainer.h"

ABSL_FLAG(std::string, data, "synthetic",
          "'synthetic', or Criteo-format TSV files (plain or .gz): comma-separated paths or "
          "glob patterns, read in order");
ABSL_FLAG(int64_t, steps, 0,
          "training steps; 0 = 10000 for synthetic data, the whole file for TSV");
ABSL_FLAG(int, epochs, 1, "passes over a TSV file");
ABSL_FLAG(int, batch_size, 256, "samples per step");
ABSL_FLAG(int, num_dense, 13, "dense features");
ABSL_FLAG(int, num_sparse, 26, "sparse (categorical) features, one table each");
ABSL_FLAG(int, emb_dim, 16, "embedding dimension");
ABSL_FLAG(std::string, bottom_mlp, "64,32", "hidden widths of the bottom MLP (it ends at emb_dim)");
ABSL_FLAG(std::string, top_mlp, "64,32", "hidden widths of the top MLP (it ends at one logit)");
ABSL_FLAG(std::string, optimizer, "adagrad",
          "embedding optimizer: sgd, adagrad, rowwise_adagrad, adam or ftrl");
ABSL_FLAG(double, lr, 0.05, "embedding learning rate");
ABSL_FLAG(std::string, emb_dtype, "fp32", "how tables store weights: fp32, fp16 or bf16");
ABSL_FLAG(std::string, dense_optimizer, "adam", "dense optimizer: adam or sgd");
ABSL_FLAG(double, dense_lr, 2e-3, "dense learning rate");
ABSL_FLAG(std::string, dense_backend, "cpu",
          "where the dense network runs: cpu (Eigen) or cuda (a GPU with cuBLAS: "
          "--cuda_device)");
ABSL_FLAG(int, cuda_device, 0,
          "with --dense_backend=cuda: the GPU, an index among those CUDA_VISIBLE_DEVICES leaves "
          "visible (data-parallel workers on one host: one each)");
ABSL_FLAG(double, init_scale, 0.05, "embedding rows start U(-init_scale, init_scale)");
ABSL_FLAG(int64_t, max_rows, 0, "row budget per table (0 = unlimited)");
ABSL_FLAG(std::string, shards, "inproc:4", "where the tables live: inproc:N");
ABSL_FLAG(
    std::string, coordinator, "",
    "host:port of a tessera-coordinator; tables then live on its shards (overrides --shards)");
ABSL_FLAG(std::string, client_mode, "smart",
          "with --coordinator: 'smart' (talk to shards directly) or 'coordinator' (every call "
          "through the coordinator)");
ABSL_FLAG(uint64_t, seed, 1, "seed of data, tables and model");
ABSL_FLAG(std::string, metrics_out, "", "write metrics as JSON Lines to this file");
ABSL_FLAG(int64_t, log_every, 100, "steps between progress lines (0 = none)");
ABSL_FLAG(std::string, cardinalities, "", "synthetic: comma-separated ids per feature");
ABSL_FLAG(double, zipf, 1.1, "synthetic: Zipf exponent of id popularity");
ABSL_FLAG(int64_t, held_out, 50000, "synthetic: held-out samples");
ABSL_FLAG(double, held_out_fraction, 0.1, "TSV: share of lines held out for evaluation");
ABSL_FLAG(int64_t, max_held_out, 200000, "TSV: cap on held-out samples");
ABSL_FLAG(std::string, on_bad_line, "skip", "TSV: 'skip' or 'stop' at a malformed line");
ABSL_FLAG(int, reader_threads, 1, "background threads making batches");
ABSL_FLAG(int, prefetch, 8, "batches prepared ahead of the trainer");
ABSL_FLAG(std::string, data_dir, "",
          "in-process tables: keep them durable in this directory (RocksDB), with checkpoints");
ABSL_FLAG(int, max_staleness, 0,
          "lookups run up to K steps ahead of the pushes applied, overlapping sparse traffic "
          "with the dense step (0 = synchronous, every lookup sees every update before it)");
ABSL_FLAG(int64_t, checkpoint_every, 0,
          "steps between checkpoints of tables and dense state, and one at the end (0 = none); "
          "needs --data_dir, or a coordinator with one");
ABSL_FLAG(std::string, model, "dlrm",
          "the model's name: its tables are NAME.C1..NAME.Cn and its checkpoints and restores "
          "touch those tables only, so several jobs share one cluster (1-64 of A-Za-z0-9_-)");
ABSL_FLAG(std::string, resume, "false",
          "'auto' (or a bare --resume): create the model's tables if they are missing and "
          "continue from its newest complete checkpoint when there is one (step 0 when not); "
          "'false': the tables must not exist yet");
ABSL_FLAG(int, keep_checkpoints, 3, "with --data_dir: newest checkpoints kept (0 = all)");
ABSL_FLAG(bool, alter_tables, false,
          "with --resume=auto: give the model's existing tables this run's --lr when theirs "
          "differs (refused otherwise, naming both); checkpoints keep it");
ABSL_FLAG(std::string, on_shard_restart, "resume",
          "when a shard restarts and its CHECKPOINT tables go back to their checkpoint: "
          "'resume' restores the model's newest checkpoint and trains on from it, 'fail' ends "
          "the run saying so");
ABSL_FLAG(int, max_retries, 8,
          "with --coordinator: retries of a call that finds a server unavailable (backoff "
          "from 50 ms doubling to 1 s), so a restart within the budget goes unnoticed");

ABSL_FLAG(int, num_workers, 1,
          "data-parallel trainers of this model (with --coordinator): each trains on its "
          "share of the data and all keep one dense model");
ABSL_FLAG(int, worker_index, 0, "with --num_workers: this trainer's index, 0 .. N-1");
ABSL_FLAG(std::string, worker_host, "127.0.0.1",
          "with --num_workers: the address this worker's gloo transport listens on (the "
          "other workers must reach it; the port is the OS's choice)");
ABSL_FLAG(int, worker_timeout_s, 20,
          "with --num_workers: how long a step waits for the other workers before the run "
          "fails naming those that did not come");
ABSL_FLAG(int, rendezvous_timeout_s, 300,
          "with --num_workers: how long to wait for every worker to join");

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

absl::StatusOr<std::vector<int>> ParseWidths(const std::string& s, const char* flag) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int w = 0;
    if (!absl::SimpleAtoi(part, &w) || w <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": bad width '", part, "'"));
    }
    out.push_back(w);
  }
  return out;
}

absl::StatusOr<int> ParseShards(const std::string& s) {
  int n = 0;
  if (absl::StartsWith(s, "inproc:") && absl::SimpleAtoi(s.substr(7), &n) && n >= 1) return n;
  return absl::InvalidArgumentError(
      absl::StrCat("--shards must be inproc:N with N >= 1, got '", s, "'"));
}

// InvalidArgument naming the flag unless lo <= value <= hi.
template <typename T>
absl::Status CheckRange(const char* flag, T value, T lo, T hi, const char* meaning = "") {
  if (value >= lo && value <= hi) return absl::OkStatus();
  std::string range = value < lo ? absl::StrCat(">= ", lo) : absl::StrCat("<= ", hi);
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, " must be ", range, ", got ", value, meaning));
}

// Every numeric flag's range, checked before anything starts.
absl::Status CheckFlagRanges() {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int kMaxInt = std::numeric_limits<int>::max();
  TESSERA_RETURN_IF_ERROR(CheckRange("steps", absl::GetFlag(FLAGS_steps), int64_t{0}, kMax,
                                     " (0 = the default length)"));
  TESSERA_RETURN_IF_ERROR(CheckRange("epochs", absl::GetFlag(FLAGS_epochs), 1, kMaxInt));
  TESSERA_RETURN_IF_ERROR(CheckRange("batch_size", absl::GetFlag(FLAGS_batch_size), 1, 1 << 22));
  TESSERA_RETURN_IF_ERROR(CheckRange("num_dense", absl::GetFlag(FLAGS_num_dense), 1, 1 << 16));
  TESSERA_RETURN_IF_ERROR(CheckRange("num_sparse", absl::GetFlag(FLAGS_num_sparse), 1, 1 << 12));
  TESSERA_RETURN_IF_ERROR(CheckRange("emb_dim", absl::GetFlag(FLAGS_emb_dim), 1, 1 << 14));
  TESSERA_RETURN_IF_ERROR(CheckRange("lr", absl::GetFlag(FLAGS_lr), 0.0, 1e6));
  TESSERA_RETURN_IF_ERROR(CheckRange("dense_lr", absl::GetFlag(FLAGS_dense_lr), 0.0, 1e6));
  TESSERA_RETURN_IF_ERROR(CheckRange("init_scale", absl::GetFlag(FLAGS_init_scale), 0.0, 1e6));
  TESSERA_RETURN_IF_ERROR(CheckRange("max_rows", absl::GetFlag(FLAGS_max_rows), int64_t{0}, kMax,
                                     " (0 = unlimited)"));
  TESSERA_RETURN_IF_ERROR(CheckRange("log_every", absl::GetFlag(FLAGS_log_every), int64_t{0},
                                     kMax, " (0 = no progress lines)"));
  TESSERA_RETURN_IF_ERROR(CheckRange("zipf", absl::GetFlag(FLAGS_zipf), 0.0, 100.0));
  TESSERA_RETURN_IF_ERROR(CheckRange("held_out", absl::GetFlag(FLAGS_held_out), int64_t{0},
                                     int64_t{kMaxInt}));
  const double fraction = absl::GetFlag(FLAGS_held_out_fraction);
  if (!(fraction >= 0.0 && fraction < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--held_out_fraction must be in [0, 1) (a share of the lines), got ", fraction));
  }
  TESSERA_RETURN_IF_ERROR(CheckRange("max_held_out", absl::GetFlag(FLAGS_max_held_out),
                                     int64_t{0}, int64_t{kMaxInt}));
  TESSERA_RETURN_IF_ERROR(
      CheckRange("reader_threads", absl::GetFlag(FLAGS_reader_threads), 1, 256));
  TESSERA_RETURN_IF_ERROR(CheckRange("prefetch", absl::GetFlag(FLAGS_prefetch), 1, 4096));
  TESSERA_RETURN_IF_ERROR(
      CheckRange("max_staleness", absl::GetFlag(FLAGS_max_staleness), 0, 1024,
                 " (0 = synchronous)"));
  TESSERA_RETURN_IF_ERROR(CheckRange("checkpoint_every", absl::GetFlag(FLAGS_checkpoint_every),
                                     int64_t{0}, kMax, " (0 = no checkpoints)"));
  TESSERA_RETURN_IF_ERROR(CheckRange("keep_checkpoints", absl::GetFlag(FLAGS_keep_checkpoints), 0,
                                     kMaxInt, " (0 = keep all)"));
  TESSERA_RETURN_IF_ERROR(CheckRange("max_retries", absl::GetFlag(FLAGS_max_retries), 0, 100));
  TESSERA_RETURN_IF_ERROR(CheckRange("num_workers", absl::GetFlag(FLAGS_num_workers), 1, 4096));
  TESSERA_RETURN_IF_ERROR(CheckRange("worker_index", absl::GetFlag(FLAGS_worker_index), 0,
                                     absl::GetFlag(FLAGS_num_workers) - 1,
                                     " (workers are numbered 0 .. --num_workers - 1)"));
  TESSERA_RETURN_IF_ERROR(
      CheckRange("worker_timeout_s", absl::GetFlag(FLAGS_worker_timeout_s), 1, 3600));
  TESSERA_RETURN_IF_ERROR(
      CheckRange("rendezvous_timeout_s", absl::GetFlag(FLAGS_rendezvous_timeout_s), 1, 86400));
  return absl::OkStatus();
}

// --resume: restores the model's newest checkpoint and returns its step (0 when there
// is none). Data-parallel, worker 0 restores the tables and its dense state and sends that
// state to the others; every worker then checks that they all hold the same step and
// the same dense parameters.
absl::StatusOr<int64_t> ResumeWorkers(Trainer& trainer, DenseBackend* dense, DataParallel* dp,
                                      const TrainerOptions& options) {
  const int worker = dp != nullptr ? dp->rank() : 0;
  int64_t step = 0;
  // What worker 0 found: "S" + the step + dense state, "N" (no checkpoint) or "E" + why not.
  std::string found;
  absl::Status refused;
  if (worker == 0) {
    absl::StatusOr<int64_t> resumed = trainer.Resume();
    if (resumed.ok()) {
      step = *resumed;
      std::printf("resume: restored checkpoint %lld of model '%s'\n",
                  static_cast<long long>(step), options.model.c_str());
      found = absl::StrCat("S", std::string(reinterpret_cast<const char*>(&step), sizeof(step)),
                           dense->SaveState());
    } else if (absl::IsNotFound(resumed.status())) {
      // Without a checkpoint there is no dense network to go with trained rows: refuse
      // rather than train a fresh one over them.
      absl::StatusOr<std::string> trained = trainer.TrainedTables();
      if (!trained.ok()) {
        refused = trained.status();
      } else if (!trained->empty()) {
        refused = absl::FailedPreconditionError(absl::StrCat(
            "model '", options.model, "' has no complete checkpoint, but its tables hold "
            "trained rows: ", *trained, ". Resuming would train a new dense network over "
            "them. To start over, drop the model's tables (tessera-cli drop --model=",
            options.model, ", or delete the --data_dir of an in-process run) and run again; or "
            "train another --model"));
      } else {
        std::printf("resume: model '%s' has no complete checkpoint yet and its tables are "
                    "untouched; starting at step 0\n", options.model.c_str());
        found = "N";
      }
      if (!refused.ok()) found = absl::StrCat("E", refused.ToString());
    } else {
      refused = Annotate(resumed.status(),
                         "resume refused (nothing was restored); pass the flags of the run that "
                         "wrote the checkpoint, or train another --model");
      found = absl::StrCat("E", refused.ToString());
    }
  }
  if (dp == nullptr || dp->size() == 1) {
    if (!refused.ok()) return refused;
    return step;
  }
  TESSERA_RETURN_IF_ERROR(Annotate(dp->Broadcast(&found, 0, std::chrono::minutes(30)),
                                   "waiting for worker 0 to restore the checkpoint"));
  if (!refused.ok()) return refused;
  if (found.empty() || (found[0] == 'S' && found.size() < 1 + sizeof(step))) {
    return absl::InternalError("resume: worker 0 sent a malformed checkpoint state");
  }
  if (found[0] == 'E') {
    return absl::FailedPreconditionError(
        absl::StrCat("worker 0 could not resume: ", found.substr(1)));
  }
  if (worker != 0 && found[0] == 'S') {
    std::memcpy(&step, found.data() + 1, sizeof(step));
    TESSERA_RETURN_IF_ERROR(
        Annotate(dense->LoadState(absl::string_view(found).substr(1 + sizeof(step))),
                 absl::StrCat("the dense state of checkpoint ", step, " from worker 0")));
    std::printf("resume: took checkpoint %lld of model '%s' from worker 0\n",
                static_cast<long long>(step), options.model.c_str());
  }
  // Every worker must now hold the same step and dense model.
  struct Held {
    int64_t step;
    uint64_t fingerprint;
  } held{step, Fingerprint(dense->Parameters())};
  TESSERA_ASSIGN_OR_RETURN(
      std::vector<std::string> all,
      dp->AllGather(std::string(reinterpret_cast<const char*>(&held), sizeof(held))));
  for (int w = 0; w < dp->size(); ++w) {
    if (all[w] != all[0]) {
      return absl::InternalError(absl::StrCat(
          "resume: worker ", w, " holds another step or dense state than worker 0"));
    }
  }
  return step;
}

absl::Status Run() {
  TESSERA_RETURN_IF_ERROR(CheckFlagRanges());
  const std::string data = absl::GetFlag(FLAGS_data);
  const bool synthetic = data == "synthetic";
  const int batch_size = absl::GetFlag(FLAGS_batch_size);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);

  DlrmConfig model;
  model.num_dense = absl::GetFlag(FLAGS_num_dense);
  model.num_sparse = absl::GetFlag(FLAGS_num_sparse);
  model.emb_dim = absl::GetFlag(FLAGS_emb_dim);
  TESSERA_ASSIGN_OR_RETURN(model.bottom_mlp,
                           ParseWidths(absl::GetFlag(FLAGS_bottom_mlp), "bottom_mlp"));
  TESSERA_ASSIGN_OR_RETURN(model.top_mlp, ParseWidths(absl::GetFlag(FLAGS_top_mlp), "top_mlp"));
  const std::string dense_opt = absl::GetFlag(FLAGS_dense_optimizer);
  if (dense_opt == "adam") {
    model.optimizer = DenseOptimizerType::kAdam;
  } else if (dense_opt == "sgd") {
    model.optimizer = DenseOptimizerType::kSgd;
  } else {
    return absl::InvalidArgumentError("--dense_optimizer must be adam or sgd");
  }
  model.learning_rate = static_cast<float>(absl::GetFlag(FLAGS_dense_lr));
  model.seed = seed;
  const std::string backend = absl::GetFlag(FLAGS_dense_backend);
  const int cuda_device = absl::GetFlag(FLAGS_cuda_device);
  if (cuda_device != 0 && backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--cuda_device=", cuda_device, " needs --dense_backend=cuda"));
  }
  absl::StatusOr<std::unique_ptr<DenseBackend>> made =
      backend == "cuda" ? NewCudaDenseBackend(model, cuda_device) : NewDenseBackend(backend, model);
  if (!made.ok()) {
    std::string context = "--dense_backend=" + backend;
    if (backend == "cuda") context += " (--dense_backend=cpu runs without a GPU)";
    return Annotate(made.status(), context);
  }
  std::unique_ptr<DenseBackend> dense = *std::move(made);

  std::unique_ptr<embedding::EmbeddingCollection> tables;
  std::string where;
  const std::string coordinator = absl::GetFlag(FLAGS_coordinator);
  const std::string data_dir = absl::GetFlag(FLAGS_data_dir);
  const int num_workers = absl::GetFlag(FLAGS_num_workers);
  const int worker = absl::GetFlag(FLAGS_worker_index);
  if (num_workers > 1 && coordinator.empty()) {
    return absl::InvalidArgumentError(
        "--num_workers > 1 needs --coordinator: the workers share their tables on a cluster "
        "and meet through its coordinator");
  }
  client::EmbeddingClient* remote_client = nullptr;  // with --coordinator
  if (coordinator.empty()) {
    TESSERA_ASSIGN_OR_RETURN(int shards, ParseShards(absl::GetFlag(FLAGS_shards)));
    if (data_dir.empty()) {
      TESSERA_ASSIGN_OR_RETURN(tables, embedding::NewInProcessCollection(shards));
      where = absl::StrCat(shards, " in-process shards");
    } else {
      storage::DurableOptions durable;
      durable.data_dir = data_dir;
      durable.num_shards = shards;
      durable.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
      durable.log = [](const std::string& line) { std::printf("%s\n", line.c_str()); };
      TESSERA_ASSIGN_OR_RETURN(tables, storage::DurableCollection::Open(durable));
      where = absl::StrCat(shards, " in-process shards, durable in ", data_dir);
    }
  } else {
    if (!data_dir.empty()) {
      return absl::InvalidArgumentError(
          "--data_dir is for in-process tables; with --coordinator the shards and the "
          "coordinator keep the data (their own --data_dir)");
    }
    client::ClientOptions co;
    const std::string mode = absl::GetFlag(FLAGS_client_mode);
    if (mode == "smart") {
      co.mode = client::ClientOptions::Mode::kSmart;
    } else if (mode == "coordinator") {
      co.mode = client::ClientOptions::Mode::kCoordinator;
    } else {
      return absl::InvalidArgumentError("--client_mode must be smart or coordinator");
    }
    TESSERA_ASSIGN_OR_RETURN(co.security, client::ClientSecurityFromFlags());
    co.max_retries = absl::GetFlag(FLAGS_max_retries);
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<client::EmbeddingClient> remote,
                             client::EmbeddingClient::Connect(coordinator, co));
    where = absl::StrCat(remote->num_shards(), " shards via ", coordinator, " (", mode, " client)");
    remote_client = remote.get();
    tables = std::move(remote);
  }

  v1::TableConfig table;
  table.set_dim(model.emb_dim);
  table.set_seed(seed * 1000003);
  table.set_max_rows(absl::GetFlag(FLAGS_max_rows));
  TESSERA_ASSIGN_OR_RETURN(v1::OptimizerType opt,
                           embedding::ParseOptimizerName(absl::GetFlag(FLAGS_optimizer)));
  TESSERA_ASSIGN_OR_RETURN(v1::Dtype dtype,
                           embedding::ParseDtypeName(absl::GetFlag(FLAGS_emb_dtype)));
  table.set_dtype(dtype);
  table.mutable_optimizer()->set_type(opt);
  table.mutable_optimizer()->set_learning_rate(static_cast<float>(absl::GetFlag(FLAGS_lr)));
  table.mutable_initializer()->set_type(v1::UNIFORM);
  table.mutable_initializer()->set_scale(static_cast<float>(absl::GetFlag(FLAGS_init_scale)));

  TrainerOptions options;
  options.model = absl::GetFlag(FLAGS_model);
  TESSERA_RETURN_IF_ERROR(Annotate(embedding::ValidateModelName(options.model), "--model"));
  options.log_every = absl::GetFlag(FLAGS_log_every);
  options.metrics_out = absl::GetFlag(FLAGS_metrics_out);
  options.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  options.max_staleness = absl::GetFlag(FLAGS_max_staleness);
  const std::string on_restart = absl::GetFlag(FLAGS_on_shard_restart);
  if (on_restart == "resume") {
    options.on_shard_restart = TrainerOptions::OnShardRestart::kResume;
  } else if (on_restart == "fail") {
    options.on_shard_restart = TrainerOptions::OnShardRestart::kFail;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--on_shard_restart must be resume or fail, got '", on_restart, "'"));
  }
  // What must match for a checkpoint to continue this run (not --steps: a resumed run may
  // go further).
  options.run_signature = absl::StrCat(
      "model=", options.model, " data=", data, " seed=", seed, " batch_size=", batch_size, " dense=", model.num_dense,
      " sparse=", model.num_sparse, " emb_dim=", model.emb_dim,
      " optimizer=", absl::GetFlag(FLAGS_optimizer), " dense_optimizer=", dense_opt,
      num_workers > 1 ? absl::StrCat(" workers=", num_workers) : "");
  options.alter_tables = absl::GetFlag(FLAGS_alter_tables);
  const std::string resume_flag = absl::GetFlag(FLAGS_resume);
  if (resume_flag != "auto" && resume_flag != "true" && resume_flag != "false") {
    return absl::InvalidArgumentError(
        absl::StrCat("--resume must be auto (or true) or false, got '", resume_flag, "'"));
  }
  const bool resume = resume_flag != "false";
  if (options.checkpoint_every > 0 || resume) {
    // Fail now, not at the first checkpoint, when there is nowhere to keep them.
    TESSERA_RETURN_IF_ERROR(tables->ListCheckpoints().status());
  }
  std::unique_ptr<server::Metrics> metrics;
  TESSERA_ASSIGN_OR_RETURN(metrics, server::StartMetricsFromFlags("train"));
  if (metrics != nullptr) {
    auto& registry = metrics->registry();
    auto& rate = prometheus::BuildGauge()
                     .Name("tessera_train_samples_per_second")
                     .Help("Training throughput over the last progress window")
                     .Register(registry)
                     .Add({});
    auto& loss = prometheus::BuildGauge()
                     .Name("tessera_train_loss")
                     .Help("Mean training loss over the last progress window")
                     .Register(registry)
                     .Add({});
    auto& steps = prometheus::BuildGauge()
                      .Name("tessera_train_step")
                      .Help("Steps trained in this run")
                      .Register(registry)
                      .Add({});
    auto& samples = prometheus::BuildGauge()
                        .Name("tessera_train_samples")
                        .Help("Samples trained in this run")
                        .Register(registry)
                        .Add({});
    options.on_progress = [&rate, &loss, &steps, &samples](const Progress& p) {
      rate.Set(p.samples_per_s);
      loss.Set(p.loss);
      steps.Set(static_cast<double>(p.step));
      samples.Set(static_cast<double>(p.samples));
    };
    auto* collection = tables.get();
    metrics->Watch([collection](server::Metrics& m) { m.ReadTables(collection); },
                   std::chrono::seconds(5));
  }
  // Data-parallel workers meet through the coordinator before anything else.
  std::unique_ptr<CoordinatorRendezvous> kv;
  std::unique_ptr<DataParallel> dp;
  if (num_workers > 1) {
    kv = std::make_unique<CoordinatorRendezvous>(remote_client);
    DataParallelOptions dpo;
    dpo.job = options.model;
    dpo.num_workers = num_workers;
    dpo.worker_index = worker;
    dpo.host = absl::GetFlag(FLAGS_worker_host);
    dpo.timeout = std::chrono::seconds(absl::GetFlag(FLAGS_worker_timeout_s));
    dpo.rendezvous_timeout = std::chrono::seconds(absl::GetFlag(FLAGS_rendezvous_timeout_s));
    std::printf("data-parallel: worker %d of %d of model '%s' joining through %s\n", worker,
                num_workers, options.model.c_str(), coordinator.c_str());
    std::fflush(stdout);
    TESSERA_ASSIGN_OR_RETURN(dp, DataParallel::Join(kv.get(), dpo));
    std::printf("data-parallel: all %d workers connected (generation %lld)\n", num_workers,
                static_cast<long long>(dp->generation()));
    options.data_parallel = dp.get();
    options.sync_timeout = dpo.timeout;
  }
  Trainer trainer(tables.get(), dense.get(), options);
  int64_t first_step = 0;
  if (worker == 0) {
    // CreateTable of an existing table with the same config is OK (creates are
    // idempotent), so existing tables are looked for first.
    TESSERA_ASSIGN_OR_RETURN(std::string existing, trainer.FirstExistingTable());
    if (!existing.empty() && !resume) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table '", existing, "' already exists: model '", options.model,
          "' has tables; pass --resume=auto to continue it, --model=OTHER to train a new "
          "model, or drop its tables first (tessera-cli drop --table=...)"));
    }
    // Creates what is missing (all of it on a first run) and checks what exists (tables
    // an operator created with tessera-cli apply, or an earlier run).
    TESSERA_RETURN_IF_ERROR(trainer.CreateTables(table));
  }
  if (dp != nullptr) {
    // Worker 0 made the tables; the others check them once it has.
    TESSERA_RETURN_IF_ERROR(Annotate(
        dp->Barrier(std::chrono::seconds(absl::GetFlag(FLAGS_rendezvous_timeout_s))),
        "waiting for worker 0 to create the model's tables"));
    if (worker != 0) TESSERA_RETURN_IF_ERROR(trainer.CheckTables(table));
  }
  if (resume) {
    TESSERA_ASSIGN_OR_RETURN(first_step, ResumeWorkers(trainer, dense.get(), dp.get(), options));
  }
  // After the resume: its restore brings back the checkpoint's settings.
  if (options.alter_tables && worker == 0) TESSERA_RETURN_IF_ERROR(trainer.AlterTables(table));

  int64_t steps = absl::GetFlag(FLAGS_steps);
  // Declared before the sources that read from them: a source's threads stop (when it is
  // destroyed, on every return) before what they read goes away.
  std::unique_ptr<SyntheticGenerator> generator;
  std::unique_ptr<CriteoReader> opened;  // the first TSV reader, checked at start-up
  CriteoOptions co;
  CriteoReader* reader = nullptr;
  Batch held_out;
  std::unique_ptr<BatchSource> source;
  // The batches from step `first` on: a resumed run, or one that went back to a checkpoint
  // after a shard restart, reads what it read then.
  std::function<absl::StatusOr<std::unique_ptr<BatchSource>>(int64_t)> make_source;
  if (synthetic) {
    SyntheticConfig sc;
    sc.num_dense = model.num_dense;
    sc.seed = seed;
    sc.zipf_s = absl::GetFlag(FLAGS_zipf);
    const std::string cards = absl::GetFlag(FLAGS_cardinalities);
    if (cards.empty()) {
      sc.cardinalities = DefaultCardinalities(model.num_sparse);
    } else {
      for (absl::string_view part : absl::StrSplit(cards, ',', absl::SkipEmpty())) {
        int64_t c = 0;
        if (!absl::SimpleAtoi(part, &c)) {
          return absl::InvalidArgumentError(
              absl::StrCat("--cardinalities: bad value '", part, "'"));
        }
        sc.cardinalities.push_back(c);
      }
      if (static_cast<int>(sc.cardinalities.size()) != model.num_sparse) {
        return absl::InvalidArgumentError(absl::StrCat("--cardinalities has ",
                                                       sc.cardinalities.size(), " values for ",
                                                       model.num_sparse, " sparse features"));
      }
    }
    TESSERA_ASSIGN_OR_RETURN(generator, SyntheticGenerator::Create(sc));
    if (steps == 0) steps = 10000;
    const SyntheticGenerator* gen = generator.get();
    make_source = [gen, batch_size, steps, num_workers, worker](
                      int64_t first) -> absl::StatusOr<std::unique_ptr<BatchSource>> {
      // Batch i is a pure function of i: a resumed run starts at its first step's batch.
      // Data-parallel worker w trains batches w, w + N, w + 2N, ...
      return std::unique_ptr<BatchSource>(std::make_unique<ParallelBatchPipeline>(
          [gen, batch_size, first, num_workers, worker](int64_t index, Batch* b) {
            gen->MakeBatch((first + index) * num_workers + worker, batch_size, b);
            return absl::OkStatus();
          },
          std::max<int64_t>(0, steps - first), absl::GetFlag(FLAGS_reader_threads),
          absl::GetFlag(FLAGS_prefetch)));
    };
    held_out = generator->MakeHeldOut(absl::GetFlag(FLAGS_held_out));
    std::printf("data: synthetic, %d dense + %d sparse features, %lld steps of %d, %d held out\n",
                model.num_dense, model.num_sparse, static_cast<long long>(steps), batch_size,
                held_out.size);
  } else {
    co.num_dense = model.num_dense;
    co.num_sparse = model.num_sparse;
    co.epochs = absl::GetFlag(FLAGS_epochs);
    co.seed = seed;
    co.held_out_fraction = absl::GetFlag(FLAGS_held_out_fraction);
    co.num_workers = num_workers;
    co.worker_index = worker;
    co.max_held_out = absl::GetFlag(FLAGS_max_held_out);
    const std::string bad = absl::GetFlag(FLAGS_on_bad_line);
    if (bad != "skip" && bad != "stop") {
      return absl::InvalidArgumentError("--on_bad_line must be skip or stop");
    }
    co.stop_on_bad_line = bad == "stop";
    // The held-out split is read first and alone: the training reader's reports follow
    // its, and with --on_bad_line=stop the first bad line of the file is the one named.
    HeldOutReport held_report;
    TESSERA_ASSIGN_OR_RETURN(held_out, CriteoReader::LoadHeldOut(data, co, &held_report));
    TESSERA_ASSIGN_OR_RETURN(opened, CriteoReader::Open(data, co, batch_size));
    const std::string files = opened->paths().size() == 1
                                  ? opened->paths()[0]
                                  : absl::StrCat(opened->paths().size(), " files");
    std::printf("data: %s, %d epoch(s), batches of %d, %d held out\n", files.c_str(), co.epochs,
                batch_size, held_out.size);
    if (held_report.bad_lines > 0) {
      std::printf("data: skipped %lld malformed held-out line(s) of %lld\n",
                  static_cast<long long>(held_report.bad_lines),
                  static_cast<long long>(held_report.lines_read));
    }
    make_source = [&](int64_t first) -> absl::StatusOr<std::unique_ptr<BatchSource>> {
      std::unique_ptr<CriteoReader> r = std::move(opened);
      if (r == nullptr) {
        TESSERA_ASSIGN_OR_RETURN(r, CriteoReader::Open(data, co, batch_size));
      }
      reader = r.get();
      auto prefetching =
          std::make_unique<PrefetchingSource>(std::move(r), absl::GetFlag(FLAGS_prefetch));
      if (first > 0) {
        // The file is read in order: pass over the batches the checkpoint has seen.
        Batch skipped;
        for (int64_t i = 0; i < first; ++i) {
          TESSERA_ASSIGN_OR_RETURN(bool more, prefetching->Next(&skipped));
          if (!more) break;
        }
        std::printf("resume: skipped the %lld batches before step %lld\n",
                    static_cast<long long>(first), static_cast<long long>(first));
      }
      return std::unique_ptr<BatchSource>(std::move(prefetching));
    };
  }
  std::printf("model: '%s' (DLRM) on %s, emb_dim %d, tables %s.C1-C%d on %s, optimizer %s\n",
              options.model.c_str(), dense->name().c_str(), model.emb_dim, options.model.c_str(),
              model.num_sparse, where.c_str(), embedding::OptimizerName(opt).c_str());
  std::fflush(stdout);

  TrainResult result;
  int64_t start = first_step;
  int64_t last_step = first_step;  // the step the model is at when training ends
  int64_t replayed = 0;            // steps trained again after a shard restart
  for (int recoveries = 0;; ++recoveries) {
    if (recoveries > 10) {
      return absl::AbortedError(
          "shards restarted more than 10 times in one run; fix them, then run again with "
          "--resume=auto");
    }
    source.reset();
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<BatchSource> data, make_source(start));
    source = std::make_unique<StoppableSource>(std::move(data), &stop_requested);
    // The workers' shares of a file differ by a line or so, and a signal reaches them at
    // different steps: they end together.
    if (dp != nullptr) source = std::make_unique<AgreedEndSource>(std::move(source), dp.get());
    TESSERA_ASSIGN_OR_RETURN(TrainResult leg, trainer.Train(source.get(), steps, start));
    result.steps += leg.steps;
    result.samples += leg.samples;
    result.seconds += leg.seconds;
    last_step = start + leg.steps;
    if (leg.resume_from < 0) break;
    replayed += last_step - leg.resume_from;
    start = leg.resume_from;  // a shard restarted: the model went back to this checkpoint
  }
  // The reader belongs to the source: what it counted is read before the source goes.
  const int64_t lines_read = reader != nullptr ? reader->lines_read() : 0;
  const int64_t bad_lines = reader != nullptr ? reader->bad_lines() : 0;
  const bool from_file = reader != nullptr;
  reader = nullptr;
  source.reset();
  if (bad_lines > 0) {
    std::printf("data: skipped %lld malformed line(s) of %lld read\n",
                static_cast<long long>(bad_lines), static_cast<long long>(lines_read));
  }
  if (stop_requested.load()) {
    ReportStop(last_step, steps, trainer, options.model);
    return absl::OkStatus();
  }
  if (from_file && steps > 0 && last_step < steps) {
    std::printf("data: the input ran out at step %lld of --steps=%lld (%lld lines read, "
                "%d epoch(s)); pass --epochs to go over it again\n",
                static_cast<long long>(last_step), static_cast<long long>(steps),
                static_cast<long long>(lines_read), co.epochs);
  }
  if (result.steps == 0) {
    if (from_file) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no training step: ", data, " has no valid training line (", lines_read, " read, ",
          bad_lines, " malformed); check the format (label, ", model.num_dense, " integers, ",
          model.num_sparse, " hex categoricals, tab-separated; plain or gzip)"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "no training step: the run was already at step ", first_step, " of ", steps,
        "; pass a larger --steps to train further"));
  }
  std::printf("trained %lld steps, %lld samples in %.1fs (%.0f samples/s)\n",
              static_cast<long long>(result.steps), static_cast<long long>(result.samples),
              result.seconds, result.seconds > 0 ? result.samples / result.seconds : 0.0);
  if (const StepTimes& t = trainer.step_times(); t.steps > 0) {
    const double ms = 1e3 / static_cast<double>(t.steps);
    std::printf("per step: lookup %.2f ms, dense %.2f ms, embedding grads %.2f ms, "
                "allreduce %.2f ms, push %.2f ms, optimizer %.2f ms\n",
                t.lookup * ms, t.dense * ms, t.grads * ms, t.allreduce * ms, t.push * ms,
                t.optimizer * ms);
  }
  if (replayed > 0) {
    std::printf("(%lld of them trained again after shard restarts sent the model back to its "
                "checkpoint)\n",
                static_cast<long long>(replayed));
  }

  if (dp != nullptr) {
    // Every worker's dense model must be the same bits: say so, and check it.
    const uint64_t mine = Fingerprint(dense->Parameters());
    TESSERA_ASSIGN_OR_RETURN(std::vector<std::string> all,
                             dp->AllGather(std::string(reinterpret_cast<const char*>(&mine),
                                                       sizeof(mine))));
    for (int w = 0; w < num_workers; ++w) {
      if (all[w] != all[0]) {
        return absl::InternalError(absl::StrCat(
            "data-parallel: worker ", w, "'s dense parameters differ from worker 0's"));
      }
    }
    const double per_step = dp->allreduces() > 0
                                ? 1e3 * dp->allreduce_seconds() / dp->allreduces()
                                : 0.0;
    std::printf("data-parallel: worker %d of %d, dense parameters %016llx on every worker, "
                "allreduce %.3f ms per step (%lld steps)\n",
                worker, num_workers, static_cast<unsigned long long>(mine), per_step,
                static_cast<long long>(dp->allreduces()));
  }
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
      last_step, eval.samples, eval.logloss, eval.auc, teacher_json,
      result.seconds));
  return absl::OkStatus();
}

}  // namespace

// What to do after a failure that ends a run, where its message does not say already.
std::string NextStepAfter(const absl::Status& s) {
  const bool checkpoints =
      absl::GetFlag(FLAGS_checkpoint_every) > 0 || absl::GetFlag(FLAGS_resume) != "false";
  const std::string resume =
      checkpoints ? "then run again with --resume=auto: it goes on from the newest checkpoint"
                  : "then run again (with --checkpoint_every, a run can go on from its last "
                    "checkpoint)";
  const absl::string_view message = s.message();
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
      // A data-parallel partner, not a server, is what is missing.
      if (absl::StrContains(message, "worker")) {
        return absl::StrCat(
            "start (or restart) the worker(s) named above with the same --coordinator, "
            "--model and --num_workers (--worker_timeout_s and --rendezvous_timeout_s wait "
            "longer), ", resume);
      }
      if (s.code() == absl::StatusCode::kAborted) return "";
      return absl::StrCat(
          "bring back the server named above (tessera-shard or tessera-coordinator; "
          "--max_retries waits longer for one that restarts), ", resume);
    case absl::StatusCode::kDataLoss:
      // An input file that is damaged: nothing of the model is.
      if (absl::StrContains(message, "corrupt or truncated")) {
        return absl::StrCat("copy or compress the input file named above again (the model's "
                            "tables are not affected), ", resume);
      }
      return absl::StrCat("restore a checkpoint (tessera-cli restore --model=",
                          absl::GetFlag(FLAGS_model), "), ", resume);
    case absl::StatusCode::kInternal:
      return absl::StrCat("see the message above, ", resume);
    default:
      return "";
  }
}

}  // namespace tessera::trainer

int main(int argc, char** argv) {
  // A bare --resume (a string flag now: auto / false) means --resume=auto.
  std::vector<std::string> args(argv, argv + argc);
  std::vector<char*> argp;
  for (std::string& a : args) {
    if (a == "--resume" || a == "-resume") a = "--resume=auto";
    argp.push_back(a.data());
  }
  tessera::client::ParseCommandLine(static_cast<int>(argp.size()), argp.data(), "tessera-train",
                                   "Trains a DLRM ranking model with Tessera embedding tables.\n"
      "  tessera-train                       synthetic data, 4 in-process shards\n"
      "  tessera-train --data=train.tsv      Criteo-format TSV\n"
      "  tessera-train --coordinator=HOST:PORT --model=NAME --resume=auto");
  absl::Status s = tessera::server::ConfigureLoggingFromFlags("tessera-train");
  tessera::trainer::command_line.assign(argv, argv + argc);
  tessera::trainer::InstallStopHandlers();
  if (s.ok()) s = tessera::trainer::Run();
  if (!s.ok()) {
    std::cerr << "tessera-train: " << s << "\n";
    const std::string next = tessera::trainer::NextStepAfter(s);
    if (!next.empty()) std::cerr << "tessera-train: next: " << next << "\n";
    return 1;
  }
  // Stopped by a signal: the shell's code for it, after the orderly stop.
  if (tessera::trainer::stop_signal != 0) return 128 + tessera::trainer::stop_signal;
  return 0;
}
