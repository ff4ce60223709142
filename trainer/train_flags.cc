#include "trainer/train_flags.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "embedding/collection.h"
#include "embedding/device/device_table.h"
#include "embedding/dtype.h"
#include "embedding/optimizer.h"
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
ABSL_FLAG(int64_t, publish_dense_every, 0,
          "with --coordinator: steps between publications of the dense network for serving "
          "replicas (tessera-serve), through the coordinator; also after the last step. 0 = "
          "none");
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
  TESSERA_RETURN_IF_ERROR(
      CheckRange("max_rows", absl::GetFlag(FLAGS_max_rows), int64_t{0}, kMax, " (0 = unlimited)"));
  TESSERA_RETURN_IF_ERROR(CheckRange("admit_min_count", absl::GetFlag(FLAGS_admit_min_count), 0,
                                     255, " (0 = every id)"));
  TESSERA_RETURN_IF_ERROR(CheckRange("admit_probability", absl::GetFlag(FLAGS_admit_probability),
                                     0.0, 1.0, " (0 = every id)"));
  TESSERA_RETURN_IF_ERROR(CheckRange("log_every", absl::GetFlag(FLAGS_log_every), int64_t{0}, kMax,
                                     " (0 = no progress lines)"));
  TESSERA_RETURN_IF_ERROR(CheckRange("zipf", absl::GetFlag(FLAGS_zipf), 0.0, 100.0));
  TESSERA_RETURN_IF_ERROR(
      CheckRange("held_out", absl::GetFlag(FLAGS_held_out), int64_t{0}, int64_t{kMaxInt}));
  const double fraction = absl::GetFlag(FLAGS_held_out_fraction);
  if (!(fraction >= 0.0 && fraction < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--held_out_fraction must be in [0, 1) (a share of the lines), got ", fraction));
  }
  TESSERA_RETURN_IF_ERROR(
      CheckRange("max_held_out", absl::GetFlag(FLAGS_max_held_out), int64_t{0}, int64_t{kMaxInt}));
  TESSERA_RETURN_IF_ERROR(
      CheckRange("reader_threads", absl::GetFlag(FLAGS_reader_threads), 1, 256));
  TESSERA_RETURN_IF_ERROR(CheckRange("prefetch", absl::GetFlag(FLAGS_prefetch), 1, 4096));
  TESSERA_RETURN_IF_ERROR(CheckRange("sparse_threads", absl::GetFlag(FLAGS_sparse_threads), 0, 1024,
                                     " (0 = every CPU)"));
  TESSERA_RETURN_IF_ERROR(CheckRange("max_staleness", absl::GetFlag(FLAGS_max_staleness), 0, 1024,
                                     " (0 = synchronous)"));
  TESSERA_RETURN_IF_ERROR(CheckRange("checkpoint_every", absl::GetFlag(FLAGS_checkpoint_every),
                                     int64_t{0}, kMax, " (0 = no checkpoints)"));
  TESSERA_RETURN_IF_ERROR(CheckRange("publish_dense_every",
                                     absl::GetFlag(FLAGS_publish_dense_every), int64_t{0}, kMax,
                                     " (0 = no publications)"));
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
    return absl::InvalidArgumentError(
        "--num_workers > 1 shares tables on a cluster: device "
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
      " emb_dtype=", absl::GetFlag(FLAGS_emb_dtype),
      " vocabulary=", absl::GetFlag(FLAGS_vocabulary));
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
  options.publish_dense_every = absl::GetFlag(FLAGS_publish_dense_every);
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

absl::StatusOr<std::vector<int64_t>> ParseCardinalities(const std::string& cards, int num_sparse) {
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
    return absl::InvalidArgumentError(absl::StrCat("--cardinalities has ", out.size(),
                                                   " values for ", num_sparse, " sparse features"));
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
  TESSERA_ASSIGN_OR_RETURN(
      const std::vector<int64_t> cards,
      ParseCardinalities(absl::GetFlag(FLAGS_cardinalities), f->model.num_sparse));
  return ParseVocabularyFlag(cards, f);
}

}  // namespace

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

}  // namespace tessera::trainer
