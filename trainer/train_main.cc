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
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/command_line.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "client/channel_policy.h"
#include "client/embedding_client.h"
#include "embedding/collection.h"
#include "embedding/device/device_collection.h"
#include "embedding/device/device_table.h"
#include "embedding/dtype.h"
#include "embedding/inprocess_collection.h"
#include "embedding/optimizer.h"
#include "embedding/storage/durable_collection.h"
#include "embedding/storage/host_checkpoints.h"
#include "observability/logging.h"
#include "observability/metrics.h"
#include "trainer/coordinator_rendezvous.h"
#include "trainer/criteo_reader.h"
#include "trainer/data_parallel.h"
#include "trainer/dense_backend.h"
#include "trainer/input_pipeline.h"
#include "trainer/synthetic.h"
#include "trainer/trainer.h"
#include "wire/security_flags.h"

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
ABSL_FLAG(std::string, eviction, "none",
          "what a table full at --max_rows does: none (refuses new rows), lru (evicts the row "
          "updated longest ago) or lfu (the one updated the fewest times); with --data_dir "
          "evicted rows go to disk and come back when next read");
ABSL_FLAG(std::string, vocabulary, "dynamic",
          "dynamic: tables take any id (a hash map); hashed: each feature's ids are taken "
          "modulo its cardinality (--cardinalities; synthetic data: its own) into "
          "fixed-vocabulary tables, rows addressed by id");
ABSL_FLAG(int, admit_min_count, 0,
          "feature admission: an id gets a row once this many steps carried it (0 or 1: at "
          "once; at most 255); until then it reads its initial weights and its gradients are "
          "dropped");
ABSL_FLAG(double, admit_probability, 0,
          "feature admission: a new id gets a row with this probability, the same for every "
          "shard and replay (0 or 1: every id)");
ABSL_FLAG(int64_t, memory_limit, 0,
          "in-process tables: bytes their rows may take together (a new row past it is "
          "refused, naming the table); 0 = the cgroup's memory limit (else 90% of physical "
          "memory) less what the process needs; negative = no budget");
ABSL_FLAG(std::string, shards, "inproc:4",
          "where the tables live: inproc:N (N in-process shards), or cuda (in the GPU's memory, "
          "beside the dense network: needs --dense_backend=cuda)");
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
ABSL_FLAG(int, sparse_threads, 0,
          "threads for a step's table work (in-process tables' lookups and pushes, the "
          "embedding gradients), a table to a thread; 0 = every CPU this process may run on "
          "(taskset -c 0 gives 1). Results do not depend on it");
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
ABSL_FLAG(int, max_retries, tessera::client::RetryPolicy().max_retries,
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
      absl::StrCat("--shards must be inproc:N with N >= 1, or cuda, got '", s, "'"));
}

// InvalidArgument naming the flag unless lo <= value <= hi.
template <typename T>
absl::Status CheckRange(const char* flag, T value, T lo, T hi, const char* meaning = "") {
  if (value >= lo && value <= hi) return absl::OkStatus();
  if (value != value) {  // NaN: neither below nor above the range
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be a number in [", lo, ", ", hi, "], got ", value));
  }
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
  TESSERA_RETURN_IF_ERROR(CheckRange("admit_min_count", absl::GetFlag(FLAGS_admit_min_count), 0,
                                     255, " (0 = every id)"));
  TESSERA_RETURN_IF_ERROR(CheckRange("admit_probability", absl::GetFlag(FLAGS_admit_probability),
                                     0.0, 1.0, " (0 = every id)"));
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
  TESSERA_RETURN_IF_ERROR(CheckRange("sparse_threads", absl::GetFlag(FLAGS_sparse_threads), 0,
                                     1024, " (0 = every CPU)"));
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

// InternalError (what `differs` says of the first worker that differs) unless every
// worker of `dp` passed the same `mine`.
absl::Status SameOnEveryWorker(DataParallel* dp, const std::string& mine,
                               const std::function<std::string(int worker)>& differs) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::string> all, dp->AllGather(mine));
  for (int w = 0; w < dp->size(); ++w) {
    if (all[w] != all[0]) return absl::InternalError(differs(w));
  }
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
  const uint64_t held[2] = {static_cast<uint64_t>(step), Fingerprint(dense->Parameters())};
  TESSERA_RETURN_IF_ERROR(SameOnEveryWorker(
      dp, std::string(reinterpret_cast<const char*>(held), sizeof(held)), [](int w) {
        return absl::StrCat("resume: worker ", w, " holds another step or dense state than "
                            "worker 0");
      }));
  return step;
}

// Every flag of a run, parsed and checked once, before anything starts.
struct TrainFlags {
  std::string data;        // "synthetic" or TSV paths
  bool synthetic = true;
  int batch_size = 0;
  uint64_t seed = 0;
  int64_t steps = 0;       // 0: the default length (synthetic) or the whole input (TSV)
  DlrmConfig model;
  std::string dense_optimizer;
  std::string backend;
  int cuda_device = 0;
  std::string coordinator;  // empty: the tables live in this process
  std::string data_dir;     // in process: where the tables are kept; empty: memory only
  int shards = 0;           // in process
  bool device_tables = false;  // --shards=cuda
  int keep_checkpoints = 0;
  std::string client_mode;        // with --coordinator
  client::ClientOptions client;   // with --coordinator
  v1::TableConfig table;          // every table's settings (the trainer names each)
  TrainerOptions options;         // on_progress and data_parallel are set later
  bool resume = false;
  int num_workers = 1;
  int worker = 0;
  DataParallelOptions data_parallel;  // with --num_workers > 1
  SyntheticConfig synthetic_data;     // synthetic
  // --vocabulary=hashed: each feature's cardinality (ids are taken modulo it); else empty.
  std::vector<int64_t> vocabulary;
  int64_t held_out = 0;               // synthetic: held-out samples
  CriteoOptions criteo;               // TSV
  int reader_threads = 1;
  int prefetch = 8;
  int sparse_threads = 1;  // resolved: 0 became the CPU count
};

absl::Status ParseModelFlags(TrainFlags* f) {
  DlrmConfig& model = f->model;
  model.num_dense = absl::GetFlag(FLAGS_num_dense);
  model.num_sparse = absl::GetFlag(FLAGS_num_sparse);
  model.emb_dim = absl::GetFlag(FLAGS_emb_dim);
  TESSERA_ASSIGN_OR_RETURN(model.bottom_mlp,
                           ParseWidths(absl::GetFlag(FLAGS_bottom_mlp), "bottom_mlp"));
  TESSERA_ASSIGN_OR_RETURN(model.top_mlp, ParseWidths(absl::GetFlag(FLAGS_top_mlp), "top_mlp"));
  f->dense_optimizer = absl::GetFlag(FLAGS_dense_optimizer);
  if (f->dense_optimizer == "adam") {
    model.optimizer = DenseOptimizerType::kAdam;
  } else if (f->dense_optimizer == "sgd") {
    model.optimizer = DenseOptimizerType::kSgd;
  } else {
    return absl::InvalidArgumentError("--dense_optimizer must be adam or sgd");
  }
  model.learning_rate = static_cast<float>(absl::GetFlag(FLAGS_dense_lr));
  model.seed = f->seed;
  f->backend = absl::GetFlag(FLAGS_dense_backend);
  f->cuda_device = absl::GetFlag(FLAGS_cuda_device);
  if (f->cuda_device != 0 && f->backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--cuda_device=", f->cuda_device, " needs --dense_backend=cuda"));
  }
  return absl::OkStatus();
}

// Where the tables live, and the data-parallel job this trainer is part of.
// --shards=cuda: every table in the dense network's GPU. Stops here, naming what is
// missing, when this build or machine has no device tables.
absl::Status DeviceTableFlags(TrainFlags* f) {
  if (f->backend != "cuda") {
    return absl::InvalidArgumentError(
        "--shards=cuda keeps the tables in the dense network's GPU: it needs "
        "--dense_backend=cuda (or use --shards=inproc:N)");
  }
  if (f->num_workers > 1) {
    return absl::InvalidArgumentError("--num_workers > 1 shares tables on a cluster: device "
                                      "tables are one trainer's");
  }
  if (absl::Status usable = embedding::device::DeviceTable::Usable(f->cuda_device); !usable.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--shards=cuda: ", usable.message(), " (--shards=inproc:N runs without)"));
  }
  f->device_tables = true;
  f->keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  return absl::OkStatus();
}

absl::Status ParsePlacementFlags(TrainFlags* f) {
  f->coordinator = absl::GetFlag(FLAGS_coordinator);
  f->data_dir = absl::GetFlag(FLAGS_data_dir);
  f->num_workers = absl::GetFlag(FLAGS_num_workers);
  f->worker = absl::GetFlag(FLAGS_worker_index);
  if (f->num_workers > 1 && f->coordinator.empty()) {
    return absl::InvalidArgumentError(
        "--num_workers > 1 needs --coordinator: the workers share their tables on a cluster "
        "and meet through its coordinator");
  }
  if (f->coordinator.empty() && absl::GetFlag(FLAGS_shards) == "cuda") return DeviceTableFlags(f);
  if (f->coordinator.empty()) {
    TESSERA_ASSIGN_OR_RETURN(f->shards, ParseShards(absl::GetFlag(FLAGS_shards)));
    f->keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
    return absl::OkStatus();
  }
  if (!f->data_dir.empty()) {
    return absl::InvalidArgumentError(
        "--data_dir is for in-process tables; with --coordinator the shards and the "
        "coordinator keep the data (their own --data_dir)");
  }
  f->client_mode = absl::GetFlag(FLAGS_client_mode);
  if (f->client_mode == "smart") {
    f->client.mode = client::ClientOptions::Mode::kSmart;
  } else if (f->client_mode == "coordinator") {
    f->client.mode = client::ClientOptions::Mode::kCoordinator;
  } else {
    return absl::InvalidArgumentError("--client_mode must be smart or coordinator");
  }
  TESSERA_ASSIGN_OR_RETURN(f->client.security, wire::ClientSecurityFromFlags());
  f->client.retry.max_retries = absl::GetFlag(FLAGS_max_retries);
  DataParallelOptions& dpo = f->data_parallel;
  dpo.num_workers = f->num_workers;
  dpo.worker_index = f->worker;
  dpo.host = absl::GetFlag(FLAGS_worker_host);
  dpo.timeout = std::chrono::seconds(absl::GetFlag(FLAGS_worker_timeout_s));
  dpo.rendezvous_timeout = std::chrono::seconds(absl::GetFlag(FLAGS_rendezvous_timeout_s));
  return absl::OkStatus();
}

// The tables' settings and the trainer's.
// What must match for a checkpoint to continue this run: the flags that shape the model
// and its data (not --steps: a resumed run may go further; not learning rates, which a
// resumed run may change). Words of key=value; the keys of the first ten predate the
// rest and stay as they were, so that older checkpoints still resume (a key a checkpoint
// does not record is not compared: embedding::CheckRestorable).
std::string RunSignature(const TrainFlags& f, const std::string& model_name) {
  const DlrmConfig& model = f.model;
  return absl::StrCat(
      "model=", model_name, " data=", f.data, " seed=", f.seed, " batch_size=", f.batch_size,
      " dense=", model.num_dense, " sparse=", model.num_sparse, " emb_dim=", model.emb_dim,
      " optimizer=", absl::GetFlag(FLAGS_optimizer), " dense_optimizer=", f.dense_optimizer,
      " workers=", f.num_workers, " bottom_mlp=", absl::StrJoin(model.bottom_mlp, ","),
      " top_mlp=", absl::StrJoin(model.top_mlp, ","), " interaction=dot",
      " emb_dtype=", absl::GetFlag(FLAGS_emb_dtype), " vocabulary=",
      absl::GetFlag(FLAGS_vocabulary));
}

// --eviction into `table`'s config.
absl::Status SetEviction(const std::string& name, v1::TableConfig* table) {
  const std::map<std::string, v1::EvictionPolicy> policies = {
      {"none", v1::EVICTION_NONE}, {"lru", v1::EVICTION_LRU}, {"lfu", v1::EVICTION_LFU}};
  const auto it = policies.find(name);
  if (it == policies.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--eviction must be none, lru or lfu, got '", name, "'"));
  }
  if (it->second != v1::EVICTION_NONE && table->max_rows() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--eviction=", name,
                     " evicts rows from a table full at its row budget: give one "
                     "with --max_rows"));
  }
  table->mutable_eviction()->set_policy(it->second);
  return absl::OkStatus();
}

absl::Status ParseTrainingFlags(TrainFlags* f) {
  v1::TableConfig& table = f->table;
  table.set_dim(f->model.emb_dim);
  table.set_seed(f->seed * 1000003);
  table.set_max_rows(absl::GetFlag(FLAGS_max_rows));
  TESSERA_RETURN_IF_ERROR(SetEviction(absl::GetFlag(FLAGS_eviction), &table));
  if (f->device_tables) table.set_placement(v1::DEVICE);
  TESSERA_ASSIGN_OR_RETURN(v1::OptimizerType opt,
                           embedding::ParseOptimizerName(absl::GetFlag(FLAGS_optimizer)));
  TESSERA_ASSIGN_OR_RETURN(v1::Dtype dtype,
                           embedding::ParseDtypeName(absl::GetFlag(FLAGS_emb_dtype)));
  table.set_dtype(dtype);
  table.mutable_optimizer()->set_type(opt);
  table.mutable_optimizer()->set_learning_rate(static_cast<float>(absl::GetFlag(FLAGS_lr)));
  table.mutable_initializer()->set_type(v1::UNIFORM);
  table.mutable_initializer()->set_scale(static_cast<float>(absl::GetFlag(FLAGS_init_scale)));
  if (absl::GetFlag(FLAGS_admit_min_count) > 1 || absl::GetFlag(FLAGS_admit_probability) > 0) {
    table.mutable_admission()->set_min_count(absl::GetFlag(FLAGS_admit_min_count));
    table.mutable_admission()->set_probability(
        static_cast<float>(absl::GetFlag(FLAGS_admit_probability)));
  }

  TrainerOptions& options = f->options;
  options.model = absl::GetFlag(FLAGS_model);
  TESSERA_RETURN_IF_ERROR(Annotate(embedding::ValidateModelName(options.model), "--model"));
  f->data_parallel.job = options.model;
  options.log_every = absl::GetFlag(FLAGS_log_every);
  options.metrics_out = absl::GetFlag(FLAGS_metrics_out);
  options.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  options.max_staleness = absl::GetFlag(FLAGS_max_staleness);
  const int requested = absl::GetFlag(FLAGS_sparse_threads);
  TESSERA_RETURN_IF_ERROR(base::ResolveThreads(requested, &f->sparse_threads));
  // Pipelined, the CPU dense step runs beside the tables' work: by default it keeps a core
  // of its own (with the dense network on a GPU, the tables take every core).
  if (requested == 0 && options.max_staleness > 0 && f->backend == "cpu") {
    f->sparse_threads = std::max(1, f->sparse_threads - 1);
  }
  options.sparse_pool = std::make_shared<base::ThreadPool>(f->sparse_threads);
  const std::string on_restart = absl::GetFlag(FLAGS_on_shard_restart);
  if (on_restart == "resume") {
    options.on_shard_restart = TrainerOptions::OnShardRestart::kResume;
  } else if (on_restart == "fail") {
    options.on_shard_restart = TrainerOptions::OnShardRestart::kFail;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--on_shard_restart must be resume or fail, got '", on_restart, "'"));
  }
  options.run_signature = RunSignature(*f, options.model);
  options.alter_tables = absl::GetFlag(FLAGS_alter_tables);
  const std::string resume_flag = absl::GetFlag(FLAGS_resume);
  if (resume_flag != "auto" && resume_flag != "true" && resume_flag != "false") {
    return absl::InvalidArgumentError(
        absl::StrCat("--resume must be auto (or true) or false, got '", resume_flag, "'"));
  }
  f->resume = resume_flag != "false";
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> ParseCardinalities(const std::string& cards,
                                                        int num_sparse) {
  if (cards.empty()) return DefaultCardinalities(num_sparse);
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(cards, ',', absl::SkipEmpty())) {
    int64_t c = 0;
    if (!absl::SimpleAtoi(part, &c)) {
      return absl::InvalidArgumentError(absl::StrCat("--cardinalities: bad value '", part, "'"));
    }
    out.push_back(c);
  }
  if (static_cast<int>(out.size()) != num_sparse) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cardinalities has ", out.size(), " values for ", num_sparse, " sparse features"));
  }
  return out;
}

// --vocabulary: dynamic, or hashed into fixed vocabularies of `cardinalities`.
absl::Status ParseVocabularyFlag(const std::vector<int64_t>& cardinalities, TrainFlags* f) {
  const std::string v = absl::GetFlag(FLAGS_vocabulary);
  if (v == "dynamic") return absl::OkStatus();
  if (v != "hashed") {
    return absl::InvalidArgumentError(
        absl::StrCat("--vocabulary must be dynamic or hashed, got '", v, "'"));
  }
  if (f->device_tables) {
    return absl::InvalidArgumentError("--vocabulary=hashed needs host tables (not --shards=cuda)");
  }
  f->vocabulary = cardinalities;
  return absl::OkStatus();
}

// Each id of `b` taken modulo its feature's vocabulary (--vocabulary=hashed).
void HashIds(const std::vector<int64_t>& vocabulary, Batch* b) {
  for (size_t f = 0; f < vocabulary.size() && f < b->ids.size(); ++f) {
    const uint64_t n = static_cast<uint64_t>(vocabulary[f]);
    for (int64_t& id : b->ids[f]) id = static_cast<int64_t>(static_cast<uint64_t>(id) % n);
  }
}

// A source whose batches' ids are hashed into fixed vocabularies.
class HashedIdsSource : public BatchSource {
 public:
  HashedIdsSource(std::unique_ptr<BatchSource> inner, std::vector<int64_t> vocabulary)
      : inner_(std::move(inner)), vocabulary_(std::move(vocabulary)) {}
  absl::StatusOr<bool> Next(Batch* batch) override {
    TESSERA_ASSIGN_OR_RETURN(const bool more, inner_->Next(batch));
    if (more) HashIds(vocabulary_, batch);
    return more;
  }

 private:
  std::unique_ptr<BatchSource> inner_;
  std::vector<int64_t> vocabulary_;
};

// The input: synthetic data's shape, or how to read TSV files.
absl::Status ParseDataFlags(TrainFlags* f) {
  f->reader_threads = absl::GetFlag(FLAGS_reader_threads);
  f->prefetch = absl::GetFlag(FLAGS_prefetch);
  if (f->synthetic) {
    SyntheticConfig& sc = f->synthetic_data;
    sc.num_dense = f->model.num_dense;
    sc.seed = f->seed;
    sc.zipf_s = absl::GetFlag(FLAGS_zipf);
    TESSERA_ASSIGN_OR_RETURN(
        sc.cardinalities,
        ParseCardinalities(absl::GetFlag(FLAGS_cardinalities), f->model.num_sparse));
    f->held_out = absl::GetFlag(FLAGS_held_out);
    if (f->steps == 0) f->steps = 10000;
    return ParseVocabularyFlag(sc.cardinalities, f);
  }
  CriteoOptions& co = f->criteo;
  co.num_dense = f->model.num_dense;
  co.num_sparse = f->model.num_sparse;
  co.epochs = absl::GetFlag(FLAGS_epochs);
  co.seed = f->seed;
  co.held_out_fraction = absl::GetFlag(FLAGS_held_out_fraction);
  co.num_workers = f->num_workers;
  co.worker_index = f->worker;
  co.max_held_out = absl::GetFlag(FLAGS_max_held_out);
  const std::string bad = absl::GetFlag(FLAGS_on_bad_line);
  if (bad != "skip" && bad != "stop") {
    return absl::InvalidArgumentError("--on_bad_line must be skip or stop");
  }
  co.stop_on_bad_line = bad == "stop";
  if (absl::GetFlag(FLAGS_vocabulary) == "hashed" && absl::GetFlag(FLAGS_cardinalities).empty()) {
    return absl::InvalidArgumentError(
        "--vocabulary=hashed on TSV data needs --cardinalities (each feature's vocabulary)");
  }
  TESSERA_ASSIGN_OR_RETURN(const std::vector<int64_t> cards,
                           ParseCardinalities(absl::GetFlag(FLAGS_cardinalities),
                                              f->model.num_sparse));
  return ParseVocabularyFlag(cards, f);
}

absl::StatusOr<TrainFlags> ParseTrainFlags() {
  TESSERA_RETURN_IF_ERROR(CheckFlagRanges());
  TrainFlags f;
  f.data = absl::GetFlag(FLAGS_data);
  f.synthetic = f.data == "synthetic";
  f.batch_size = absl::GetFlag(FLAGS_batch_size);
  f.seed = absl::GetFlag(FLAGS_seed);
  f.steps = absl::GetFlag(FLAGS_steps);
  TESSERA_RETURN_IF_ERROR(ParseModelFlags(&f));
  TESSERA_RETURN_IF_ERROR(ParsePlacementFlags(&f));
  TESSERA_RETURN_IF_ERROR(ParseTrainingFlags(&f));
  TESSERA_RETURN_IF_ERROR(ParseDataFlags(&f));
  return f;
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
    TESSERA_RETURN_IF_ERROR(out.tables->ListCheckpoints().status());
  }
  return out;
}

prometheus::Gauge& TrainGauge(prometheus::Registry& registry, const std::string& name,
                              const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
}

// --metrics_port: the trainer's progress and its tables' sizes (null without the flag).
absl::StatusOr<std::unique_ptr<observability::Metrics>> StartTrainMetrics(
    embedding::EmbeddingCollection* tables, TrainerOptions* options) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<observability::Metrics> metrics,
                           observability::StartMetricsFromFlags("train"));
  if (metrics == nullptr) return metrics;
  auto& registry = metrics->registry();
  auto& rate = TrainGauge(registry, "tessera_train_samples_per_second",
                          "Training throughput over the last progress window");
  auto& loss = TrainGauge(registry, "tessera_train_loss",
                          "Mean training loss over the last progress window");
  auto& steps = TrainGauge(registry, "tessera_train_step", "Steps trained in this run");
  auto& samples = TrainGauge(registry, "tessera_train_samples", "Samples trained in this run");
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
    TESSERA_ASSIGN_OR_RETURN(first_step, ResumeWorkers(trainer, dense, dp, options));
  }
  // After the resume: its restore brings back the checkpoint's settings.
  if (options.alter_tables && f.worker == 0) {
    TESSERA_RETURN_IF_ERROR(trainer.AlterTables(f.table));
  }
  return first_step;
}

// A run's input: the held-out batch and the training batches from any step on. Members
// are destroyed in reverse order: the source (whose threads read the others) first.
struct TrainData {
  std::unique_ptr<SyntheticGenerator> generator;
  std::unique_ptr<CriteoReader> opened;  // the first TSV reader, checked at start-up
  CriteoReader* reader = nullptr;        // the TSV reader in use (owned by the source)
  Batch held_out;
  // The batches from step `first` on: a resumed run, or one that went back to a checkpoint
  // after a shard restart, reads what it read then.
  std::function<absl::StatusOr<std::unique_ptr<BatchSource>>(int64_t)> make_source;
  std::unique_ptr<BatchSource> source;
};

absl::Status OpenSyntheticData(const TrainFlags& f, TrainData* d) {
  TESSERA_ASSIGN_OR_RETURN(d->generator, SyntheticGenerator::Create(f.synthetic_data));
  const SyntheticGenerator* gen = d->generator.get();
  d->make_source = [gen, &f](int64_t first) -> absl::StatusOr<std::unique_ptr<BatchSource>> {
    // Batch i is a pure function of i: a resumed run starts at its first step's batch.
    // Data-parallel worker w trains batches w, w + N, w + 2N, ...
    const int batch_size = f.batch_size, num_workers = f.num_workers, worker = f.worker;
    return std::unique_ptr<BatchSource>(std::make_unique<ParallelBatchPipeline>(
        [gen, batch_size, first, num_workers, worker](int64_t index, Batch* b) {
          gen->MakeBatch((first + index) * num_workers + worker, batch_size, b);
          return absl::OkStatus();
        },
        std::max<int64_t>(0, f.steps - first), f.reader_threads, f.prefetch));
  };
  d->held_out = d->generator->MakeHeldOut(f.held_out);
  std::printf("data: synthetic, %d dense + %d sparse features, %lld steps of %d, %d held out\n",
              f.model.num_dense, f.model.num_sparse, static_cast<long long>(f.steps),
              f.batch_size, d->held_out.size);
  return absl::OkStatus();
}

absl::Status OpenFileData(const TrainFlags& f, TrainData* d) {
  // The held-out split is read first and alone: the training reader's reports follow
  // its, and with --on_bad_line=stop the first bad line of the file is the one named.
  HeldOutReport held_report;
  TESSERA_ASSIGN_OR_RETURN(d->held_out, CriteoReader::LoadHeldOut(f.data, f.criteo, &held_report));
  TESSERA_ASSIGN_OR_RETURN(d->opened, CriteoReader::Open(f.data, f.criteo, f.batch_size));
  const std::string files = d->opened->paths().size() == 1
                                ? d->opened->paths()[0]
                                : absl::StrCat(d->opened->paths().size(), " files");
  std::printf("data: %s, %d epoch(s), batches of %d, %d held out\n", files.c_str(),
              f.criteo.epochs, f.batch_size, d->held_out.size);
  if (held_report.bad_lines > 0) {
    std::printf("data: skipped %lld malformed held-out line(s) of %lld\n",
                static_cast<long long>(held_report.bad_lines),
                static_cast<long long>(held_report.lines_read));
  }
  d->make_source = [d, &f](int64_t first) -> absl::StatusOr<std::unique_ptr<BatchSource>> {
    std::unique_ptr<CriteoReader> r = std::move(d->opened);
    if (r == nullptr) {
      TESSERA_ASSIGN_OR_RETURN(r, CriteoReader::Open(f.data, f.criteo, f.batch_size));
    }
    d->reader = r.get();
    auto prefetching = std::make_unique<PrefetchingSource>(std::move(r), f.prefetch);
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
  return absl::OkStatus();
}

// --vocabulary=hashed: the held-out batch and every batch of the sources hashed.
void HashData(const TrainFlags& f, TrainData* d) {
  HashIds(f.vocabulary, &d->held_out);
  auto inner = std::move(d->make_source);
  d->make_source = [inner, &f](int64_t first) -> absl::StatusOr<std::unique_ptr<BatchSource>> {
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<BatchSource> source, inner(first));
    return std::unique_ptr<BatchSource>(
        std::make_unique<HashedIdsSource>(std::move(source), f.vocabulary));
  };
  std::printf("vocabulary: hashed, ids taken modulo each feature's cardinality into "
              "fixed-vocabulary tables\n");
}

// What the training legs of a run came to.
struct Trained {
  TrainResult result;
  int64_t last_step = 0;  // the step the model is at when training ends
  int64_t replayed = 0;   // steps trained again after a shard restart
  int64_t lines_read = 0, bad_lines = 0;  // TSV input
  bool from_file = false;
};

// Trains from `first_step` to the end of the input, going back to the newest checkpoint
// when a shard restarts (up to 10 times).
absl::StatusOr<Trained> TrainLegs(Trainer& trainer, TrainData* d, DataParallel* dp,
                                  int64_t steps, int64_t first_step) {
  Trained out;
  int64_t start = first_step;
  out.last_step = first_step;
  for (int recoveries = 0;; ++recoveries) {
    if (recoveries > 10) {
      return absl::AbortedError(
          "shards restarted more than 10 times in one run; fix them, then run again with "
          "--resume=auto");
    }
    d->source.reset();
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<BatchSource> data, d->make_source(start));
    d->source = std::make_unique<StoppableSource>(std::move(data), &stop_requested);
    // The workers' shares of a file differ by a line or so, and a signal reaches them at
    // different steps: they end together.
    if (dp != nullptr) d->source = std::make_unique<AgreedEndSource>(std::move(d->source), dp);
    TESSERA_ASSIGN_OR_RETURN(TrainResult leg, trainer.Train(d->source.get(), steps, start));
    out.result.steps += leg.steps;
    out.result.samples += leg.samples;
    out.result.seconds += leg.seconds;
    out.last_step = start + leg.steps;
    if (leg.resume_from < 0) break;
    out.replayed += out.last_step - leg.resume_from;
    start = leg.resume_from;  // a shard restarted: the model went back to this checkpoint
  }
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
    std::printf("per step: lookup %.2f ms, dense %.2f ms, embedding grads %.2f ms, "
                "allreduce %.2f ms, push %.2f ms, optimizer %.2f ms\n",
                s.lookup * ms, s.dense * ms, s.grads * ms, s.allreduce * ms, s.push * ms,
                s.optimizer * ms);
    // Pipelined, the tables' work runs while the dense step does: a step nears the larger.
    std::printf("per step: sparse work %.2f ms, dense %.2f ms, step %.2f ms\n",
                s.sparse_work * ms, (s.dense + s.optimizer) * ms, s.wall * ms);
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
  const uint64_t mine = Fingerprint(dense->Parameters());
  TESSERA_RETURN_IF_ERROR(SameOnEveryWorker(
      dp, std::string(reinterpret_cast<const char*>(&mine), sizeof(mine)), [](int w) {
        return absl::StrCat("data-parallel: worker ", w,
                            "'s dense parameters differ from worker 0's");
      }));
  const double per_step =
      dp->allreduces() > 0 ? 1e3 * dp->allreduce_seconds() / dp->allreduces() : 0.0;
  std::printf("data-parallel: worker %d of %d, dense parameters %016llx on every worker, "
              "allreduce %.3f ms per step (%lld steps)\n",
              worker, dp->size(), static_cast<unsigned long long>(mine), per_step,
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

absl::Status Run() {
  TESSERA_ASSIGN_OR_RETURN(const TrainFlags f, ParseTrainFlags());
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<DenseBackend> dense, MakeDenseBackend(f));
  TESSERA_ASSIGN_OR_RETURN(TrainTables tables, MakeTables(f));
  TrainerOptions options = f.options;
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<observability::Metrics> metrics,
                           StartTrainMetrics(tables.tables.get(), &options));
  TESSERA_ASSIGN_OR_RETURN(Workers workers, JoinWorkers(f, tables.remote, &options));
  DataParallel* dp = workers.dp.get();
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
    const std::string next = tessera::trainer::NextStepAfter(s);
    if (!next.empty()) std::cerr << "tessera-train: next: " << next << "\n";
    return 1;
  }
  // Stopped by a signal: the shell's code for it, after the orderly stop.
  if (tessera::trainer::stop_signal != 0) return 128 + tessera::trainer::stop_signal;
  return 0;
}
