#include "benchmarks/bench/runner.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <thread>

#include "Eigen/Dense"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "benchmarks/bench/local_cluster.h"
#include "benchmarks/bench/measures.h"
#include "benchmarks/memcpy_ceiling.h"
#if TESSERA_HAVE_HIREDIS
#include "benchmarks/bench/redis_collection.h"
#endif
#include "base/status.h"
#include "base/thread_pool.h"
#include "base/zipf_sampler.h"
#include "client/embedding_client.h"
#include "embedding/collection.h"
#include "embedding/device/device_collection.h"
#include "embedding/dtype.h"
#include "embedding/forwarding_collection.h"
#include "embedding/inprocess_collection.h"
#include "embedding/optimizer.h"
#include "trainer/coordinator_rendezvous.h"
#include "trainer/data_parallel.h"
#include "trainer/dense_backend.h"
#include "trainer/synthetic.h"
#include "trainer/trainer.h"

namespace tessera::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Forwards to a collection and records how long each call took.
class TimedCollection final : public embedding::ForwardingCollection {
 public:
  explicit TimedCollection(embedding::EmbeddingCollection* inner) : ForwardingCollection(inner) {}

  absl::Status Lookup(absl::string_view table, absl::Span<const int64_t> ids, absl::Span<float> out,
                      const embedding::LookupOptions& o) override {
    return Time([&] { return ForwardingCollection::Lookup(table, ids, out, o); });
  }
  absl::Status PooledLookup(absl::string_view table, absl::Span<const int64_t> ids,
                            absl::Span<const int32_t> offsets, absl::Span<const float> weights,
                            v1::Pooling pooling, absl::Span<float> out,
                            const embedding::LookupOptions& o) override {
    return Time([&] {
      return ForwardingCollection::PooledLookup(table, ids, offsets, weights, pooling, out, o);
    });
  }
  absl::Status PushGradients(absl::string_view table, absl::Span<const int64_t> ids,
                             absl::Span<const float> gradients, int64_t step) override {
    return Time([&] { return ForwardingCollection::PushGradients(table, ids, gradients, step); });
  }
  absl::Status LookupBatch(absl::Span<const embedding::TableBags> tables,
                           const embedding::LookupOptions& o) override {
    return Time([&] { return ForwardingCollection::LookupBatch(tables, o); });
  }
  absl::Status PushBatch(absl::Span<const embedding::TableGradients> tables, int64_t step,
                         const embedding::PushOptions& o) override {
    return Time([&] { return ForwardingCollection::PushBatch(tables, step, o); });
  }
  // A step's push riding on the next lookup, as the trainer sends it to a remote collection.
  absl::Status PushThenLookup(absl::Span<const embedding::TableGradients> push, int64_t step,
                              const embedding::PushOptions& push_options,
                              absl::Span<const embedding::TableBags> lookups,
                              const embedding::LookupOptions& o) override {
    return Time([&] { return inner()->PushThenLookup(push, step, push_options, lookups, o); });
  }
  bool FusesPushAndLookup() const override { return inner()->FusesPushAndLookup(); }

  void set_recording(bool on) { recording_.store(on); }
  std::vector<double> TakeCallMs() {
    absl::MutexLock lock(&mu_);
    return std::move(call_ms_);
  }

 private:
  template <typename F>
  absl::Status Time(const F& f) {
    const auto start = Clock::now();
    absl::Status s = f();
    if (recording_.load(std::memory_order_relaxed)) {
      const double ms = Seconds(Clock::now() - start) * 1e3;
      absl::MutexLock lock(&mu_);
      call_ms_.push_back(ms);
    }
    return s;
  }

  std::atomic<bool> recording_{false};
  absl::Mutex mu_;
  std::vector<double> call_ms_ ABSL_GUARDED_BY(mu_);
};

// One table of a scenario, as the workload sees it.
struct TableWork {
  std::string name;
  int dim = 0;
  int64_t rows = 0;
  v1::Dtype dtype = v1::FP32;
};

// Pre-drawn ids, so that drawing them is not measured.
struct IdBatch {
  std::vector<std::vector<int64_t>> ids;      // per table
  std::vector<std::vector<int32_t>> offsets;  // per table, when pooled
};

// Ids are drawn before the timed loop (drawing them, Zipf most of all, would be timed
// otherwise), in enough batches that the pool covers the largest table kPoolCoverage times
// over: a scenario's `rows` is then the working set it says, not the few rows a handful
// of cycled batches touch (16 batches of 4096 touched at most 65,536 rows of a
// "1,000,000-row" table, a set that fits in cache). Within kPoolIdBudget ids in all.
constexpr int kMinPoolBatches = 16;
constexpr int64_t kPoolCoverage = 3;
constexpr int64_t kPoolIdBudget = int64_t{64} << 20;  // 512 MiB of ids

int PoolBatches(int64_t max_rows, int64_t ids_per_table, size_t tables) {
  if (ids_per_table <= 0 || tables == 0) return kMinPoolBatches;
  const int64_t want = (kPoolCoverage * max_rows + ids_per_table - 1) / ids_per_table;
  const int64_t cap = std::max<int64_t>(
      kMinPoolBatches, kPoolIdBudget / (ids_per_table * static_cast<int64_t>(tables)));
  return static_cast<int>(std::clamp<int64_t>(want, kMinPoolBatches, cap));
}

// Matrix FLOPs of one training step: per layer 2*out*in*batch forward, twice that
// backward (weight and input gradients), and the pairwise dot interaction both ways.
double StepFlops(const trainer::DlrmConfig& m, int batch) {
  double flops = 0;
  for (const trainer::DlrmLayerShape& l : trainer::DlrmLayerShapes(m)) {
    flops += 6.0 * l.out * l.in * batch;
  }
  const int f1 = m.num_sparse + 1;
  flops += 3.0 * 2.0 * (f1 * (f1 - 1) / 2) * m.emb_dim * batch;
  return flops;
}

// Eigen GEMM GFLOP/s over the forward shapes of the model's layers at `batch`.
double GemmGflops(const trainer::DlrmConfig& m, int batch) {
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic>;
  double flops = 0, seconds = 0;
  for (const trainer::DlrmLayerShape& l : trainer::DlrmLayerShapes(m)) {
    const Mat w = Mat::Random(l.out, l.in), x = Mat::Random(l.in, batch);
    Mat y(l.out, batch);
    y.noalias() = w * x;  // warm
    const auto start = Clock::now();
    int reps = 0;
    do {
      y.noalias() = w * x;
      ++reps;
    } while (Seconds(Clock::now() - start) < 0.05);
    seconds += Seconds(Clock::now() - start);
    flops += 2.0 * l.out * l.in * batch * reps;
    volatile float sink = y(0, 0);
    (void)sink;
  }
  return flops / seconds / 1e9;
}

// A data-parallel worker of a training scenario (workers > 1); worker 0's trainer is the
// run's own `dlrm`, on its timed tables.
struct BenchWorker {
  std::unique_ptr<client::EmbeddingClient> client;  // workers 1..
  std::unique_ptr<trainer::DenseBackend> dense;     // workers 1..
  std::unique_ptr<trainer::DataParallel> dp;
  std::unique_ptr<trainer::Trainer> trainer;  // workers 1..
};

// Training batches, round the pool for as long as the scenario runs. Data-parallel worker
// w of N takes batches w, w + N, ...
class PoolSource final : public trainer::BatchSource {
 public:
  PoolSource(const std::vector<trainer::Batch>* pool, size_t first, size_t stride)
      : pool_(pool), next_(first), stride_(stride) {}
  absl::StatusOr<bool> Next(trainer::Batch* batch) override {
    *batch = (*pool_)[next_ % pool_->size()];
    next_ += stride_;
    return true;
  }

 private:
  const std::vector<trainer::Batch>* pool_;
  size_t next_;
  const size_t stride_;
};

// One scenario's run, stage by stage: its price, its tables, its workload's inputs, the
// measured loop and the figures. Members are destroyed in reverse order: the trainers and
// clients before the tables and the cluster they use.
class ScenarioRun {
 public:
  ScenarioRun(const Scenario& input, const RunOptions& options) : options_(options) {
    r.scenario = input;
  }

  absl::StatusOr<ScenarioResult> Run() {
    TESSERA_RETURN_IF_ERROR(Normalize(&s));
    TESSERA_RETURN_IF_ERROR(PriceNodes());
    TESSERA_RETURN_IF_ERROR(StartTables());
    TESSERA_RETURN_IF_ERROR(DescribeTables());
    if (train) {
      TESSERA_RETURN_IF_ERROR(PrepareTraining());
    } else {
      TESSERA_RETURN_IF_ERROR(CreateTables());
      DrawIds();
      TESSERA_RETURN_IF_ERROR(FillRows());
    }
    CountStepPayload();
    TESSERA_RETURN_IF_ERROR(Measure());
    TESSERA_RETURN_IF_ERROR(Figures());
    Progress(absl::StrFormat("%.0f samples/s, step p50 %.2f ms p99 %.2f ms", r.samples_per_s,
                             r.step_ms[0], r.step_ms[1]));
    return r;
  }

 private:
  void Progress(const std::string& line) {
    if (options_.progress) options_.progress(absl::StrCat(s.name(), ": ", line));
  }

  // Cost first: an unknown node type should fail before anything starts.
  absl::Status PriceNodes() {
    for (const NodeSpec& n : s.nodes()) {
      if (options_.prices == nullptr || options_.prices->nodes().count(n.type()) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "scenario '", s.name(), "': node type '", n.type(), "' is not in the price table"));
      }
      r.usd_per_hour +=
          options_.prices->nodes().at(n.type()).usd_per_hour() * std::max(1, n.count());
    }
    return absl::OkStatus();
  }

  // Where the tables live.
  absl::Status StartTables() {
    absl::StatusOr<std::shared_ptr<base::ThreadPool>> pool =
        base::NewThreadPool(s.sparse_threads());
    TESSERA_RETURN_IF_ERROR(
        Annotate(pool.status(), absl::StrCat("scenario '", s.name(), "': sparse_threads")));
    sparse_pool = *std::move(pool);
    if (s.mode() == "inproc") {
      embedding::InProcessOptions in_process;
      in_process.num_shards = s.shards();
      in_process.pool = sparse_pool;
      TESSERA_ASSIGN_OR_RETURN(tables, embedding::NewInProcessCollection(in_process));
    } else if (s.mode() == "cuda") {
      // Every table in GPU 0's memory (device tables), beside a CUDA dense backend.
      TESSERA_ASSIGN_OR_RETURN(tables, embedding::device::NewDeviceCollection(0));
    } else if (s.mode() == "redis") {
#if TESSERA_HAVE_HIREDIS
      Progress("starting redis-server");
      TESSERA_ASSIGN_OR_RETURN(redis, RedisServer::Start());
      TESSERA_ASSIGN_OR_RETURN(tables, NewRedisCollection(redis->port()));
      servers.emplace_back("redis-server", redis->pid());
#else
      return absl::UnimplementedError("tessera-bench was built without hiredis: no redis mode");
#endif
    } else {
      Progress(absl::StrCat("starting ", s.shards(), " shard(s) and a coordinator"));
      TESSERA_ASSIGN_OR_RETURN(cluster, LocalCluster::Start(options_.bin_dir, s.shards()));
      co.mode = s.mode() == "smart" ? client::ClientOptions::Mode::kSmart
                                    : client::ClientOptions::Mode::kCoordinator;
      TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<client::EmbeddingClient> remote,
                               client::EmbeddingClient::Connect(cluster->coordinator(), co));
      tables = std::move(remote);
    }
    timed = std::make_unique<TimedCollection>(tables.get());
    return absl::OkStatus();
  }

  // The tables as the workload sees them, and what their rows hold: weights in their
  // dtype and the optimizer's fp32 state.
  absl::Status DescribeTables() {
    TESSERA_ASSIGN_OR_RETURN(opt, embedding::ParseOptimizerName(s.optimizer()));
    for (const TableSpec& spec : s.tables()) {
      for (int i = 0; i < spec.count(); ++i) {
        work.push_back(TableWork{absl::StrCat("C", work.size() + 1), spec.dim(), spec.rows(),
                                 *embedding::ParseDtypeName(spec.dtype())});
      }
    }
    for (const auto& t : work) {
      v1::OptimizerConfig oc;
      oc.set_type(opt);
      TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<embedding::Optimizer> o,
                               embedding::Optimizer::Create(oc, t.dim));
      table_bytes += t.rows * (t.dim * embedding::DtypeBytes(t.dtype) + 4 * o->StateFloats());
      max_rows = std::max(max_rows, t.rows);
    }
    train = s.workload() == "train";
    lookups = s.workload() == "lookup" || s.workload() == "lookup_update";
    updates = s.workload() == "update" || s.workload() == "lookup_update";
    pooled = s.ids_per_sample() > 1;
    // Lookup and update workloads keep max_staleness steps in flight on as many threads; a
    // training run is one trainer, pipelined max_staleness steps deep.
    threads = train ? 1 : std::max(1, s.max_staleness());
    ids_per_table = s.batch_size() * s.ids_per_sample();
    return absl::OkStatus();
  }

  // The dense half, the data-parallel workers, the model's tables and its batches.
  absl::Status PrepareTraining() {
    model.bottom_mlp.assign(s.bottom_mlp().begin(), s.bottom_mlp().end());
    model.top_mlp.assign(s.top_mlp().begin(), s.top_mlp().end());
    model.num_sparse = static_cast<int>(work.size());
    model.emb_dim = work[0].dim;
    model.seed = s.seed();
    absl::StatusOr<std::unique_ptr<trainer::DenseBackend>> made =
        trainer::NewDenseBackend(s.dense_backend(), model);
    if (!made.ok()) {
      return Annotate(made.status(), absl::StrCat("scenario '", s.name(), "': dense_backend ",
                                                  s.dense_backend()));
    }
    dense = *std::move(made);
    trainer::TrainerOptions to;
    to.print_progress = false;
    to.log_every = 0;
    to.max_staleness = s.max_staleness();
    to.sparse_pool = sparse_pool;
    if (s.workers() > 1) TESSERA_RETURN_IF_ERROR(JoinWorkers(&to));
    dlrm = std::make_unique<trainer::Trainer>(timed.get(), dense.get(), to);
    v1::TableConfig proto;
    proto.set_dim(model.emb_dim);
    proto.set_dtype(work[0].dtype);
    proto.set_seed(s.seed());
    proto.mutable_optimizer()->set_type(opt);
    if (s.mode() == "cuda") {
      proto.set_placement(v1::DEVICE);
      proto.set_max_rows(max_rows);  // a device table holds what its ids can reach
    }
    TESSERA_RETURN_IF_ERROR(dlrm->CreateTables(proto));
    trainer::SyntheticConfig sc;
    sc.num_dense = model.num_dense;
    sc.seed = s.seed();
    sc.zipf_s = s.distribution() == "zipf" ? s.zipf_s() : 0.0;
    for (const auto& t : work) sc.cardinalities.push_back(t.rows);
    TESSERA_ASSIGN_OR_RETURN(auto gen, trainer::SyntheticGenerator::Create(sc));
    train_batches.resize(PoolBatches(max_rows, s.batch_size(), work.size()));
    for (size_t b = 0; b < train_batches.size(); ++b) {
      gen->MakeBatch(static_cast<int64_t>(b), s.batch_size(), &train_batches[b]);
    }
    return absl::OkStatus();
  }

  // Worker 0 is this run's trainer on `timed`; workers 1.. get clients of their own. All
  // join the job through the cluster's coordinator.
  absl::Status JoinWorkers(trainer::TrainerOptions* to) {
    Progress(absl::StrFormat("connecting %d data-parallel workers", s.workers()));
    workers.resize(s.workers());
    for (int w = 1; w < s.workers(); ++w) {
      TESSERA_ASSIGN_OR_RETURN(workers[w].client,
                               client::EmbeddingClient::Connect(cluster->coordinator(), co));
      TESSERA_ASSIGN_OR_RETURN(workers[w].dense,
                               trainer::NewDenseBackend(s.dense_backend(), model));
    }
    rendezvous = std::make_unique<trainer::CoordinatorRendezvous>(
        static_cast<client::EmbeddingClient*>(tables.get()));
    std::vector<absl::Status> joined(s.workers());
    std::vector<std::thread> joining;
    for (int w = 0; w < s.workers(); ++w) {
      joining.emplace_back([&, w] {
        trainer::DataParallelOptions o;
        o.job = absl::StrCat("bench-", s.name());
        o.num_workers = s.workers();
        o.worker_index = w;
        o.rendezvous_timeout = std::chrono::seconds(60);
        absl::StatusOr<std::unique_ptr<trainer::DataParallel>> dp =
            trainer::DataParallel::Join(rendezvous.get(), o);
        joined[w] = dp.status();
        if (dp.ok()) workers[w].dp = *std::move(dp);
      });
    }
    for (auto& t : joining) t.join();
    for (const auto& j : joined) TESSERA_RETURN_IF_ERROR(j);
    for (int w = 1; w < s.workers(); ++w) {
      trainer::TrainerOptions wo = *to;
      wo.data_parallel = workers[w].dp.get();
      workers[w].trainer = std::make_unique<trainer::Trainer>(workers[w].client.get(),
                                                              workers[w].dense.get(), wo);
    }
    to->data_parallel = workers[0].dp.get();
    return absl::OkStatus();
  }

  absl::Status CreateTables() {
    for (const auto& t : work) {
      v1::TableConfig c;
      c.set_name(t.name);
      c.set_dim(t.dim);
      c.set_dtype(t.dtype);
      c.set_seed(s.seed());
      c.mutable_optimizer()->set_type(opt);
      if (s.mode() == "cuda") {
        c.set_placement(v1::DEVICE);
        c.set_max_rows(t.rows);
      }
      TESSERA_RETURN_IF_ERROR(timed->CreateTable(c));
    }
    return absl::OkStatus();
  }

  // Ids for every step, drawn up front.
  void DrawIds() {
    std::mt19937_64 rng(s.seed());
    pool.resize(PoolBatches(max_rows, ids_per_table, work.size()));
    for (auto& b : pool) {
      for (const auto& t : work) {
        std::vector<int64_t> ids(ids_per_table);
        if (s.distribution() == "zipf") {
          base::ZipfSampler zipf(t.rows, s.zipf_s());
          for (auto& id : ids) id = zipf(rng) - 1;
        } else {
          for (auto& id : ids) id = static_cast<int64_t>(rng() % static_cast<uint64_t>(t.rows));
        }
        b.ids.push_back(std::move(ids));
        std::vector<int32_t> offsets;
        if (pooled) {
          for (int i = 0; i <= s.batch_size(); ++i) offsets.push_back(i * s.ids_per_sample());
        }
        b.offsets.push_back(std::move(offsets));
      }
    }
  }

  // Every row of every table exists before the clock starts, so the scenario measures a
  // table of `rows` rows, not the creation of most of them (ids are drawn from [0, rows)).
  // A zero gradient creates a row at its initial weights on every backend.
  absl::Status FillRows() {
    constexpr int64_t kFillBatch = 65536;
    int64_t total = 0;
    for (const auto& t : work) total += t.rows;
    Progress(absl::StrFormat("creating the tables' %d rows", total));
    std::vector<int64_t> ids;
    std::vector<float> zeros;
    for (const auto& t : work) {
      for (int64_t begin = 0; begin < t.rows; begin += kFillBatch) {
        ids.resize(static_cast<size_t>(std::min(kFillBatch, t.rows - begin)));
        std::iota(ids.begin(), ids.end(), begin);
        zeros.assign(ids.size() * t.dim, 0.0f);
        TESSERA_RETURN_IF_ERROR(Annotate(timed->PushGradients(t.name, ids, zeros, 0),
                                         absl::StrCat("creating the rows of ", t.name)));
      }
    }
    return absl::OkStatus();
  }

  // Payload per step, as it would travel: 8 bytes per id sent, 4 x dim per row back or
  // pushed.
  void CountStepPayload() {
    for (const auto& t : work) {
      const int64_t rows_back = pooled ? s.batch_size() : ids_per_table;
      if (lookups || train) {
        step_lookups += ids_per_table;
        step_bytes += ids_per_table * 8 + rows_back * t.dim * 4;
      }
      if (updates || train) {
        step_updates += ids_per_table;
        step_bytes += ids_per_table * (8 + t.dim * 4);
      }
    }
  }

  void Fail(const absl::Status& st) {
    absl::MutexLock lock(&mu);
    if (failure.ok()) failure = st;
    stop = true;
  }

  // One step of a lookup or update workload: every table's part of pool batch `b`.
  absl::Status TableStep(const IdBatch& b, int64_t step, std::vector<std::vector<float>>& out,
                         const std::vector<std::vector<float>>& grads) {
    absl::Status st;
    for (size_t k = 0; k < work.size() && st.ok(); ++k) {
      if (lookups) {
        st = pooled ? timed->PooledLookup(work[k].name, b.ids[k], b.offsets[k], {}, v1::SUM,
                                          absl::MakeSpan(out[k]), {})
                    : timed->Lookup(work[k].name, b.ids[k], absl::MakeSpan(out[k]), {});
      }
      if (st.ok() && updates) st = timed->PushGradients(work[k].name, b.ids[k], grads[k], step);
    }
    return st;
  }

  // One thread's loop of a lookup, update or single-trainer workload.
  void WorkerLoop(int index) {
    std::vector<std::vector<float>> out(work.size()), grads(work.size());
    for (size_t k = 0; k < work.size(); ++k) {
      out[k].resize(static_cast<size_t>(pooled ? s.batch_size() : ids_per_table) * work[k].dim);
      grads[k].assign(static_cast<size_t>(ids_per_table) * work[k].dim, 1e-3f);
    }
    std::vector<double> mine;
    while (!stop.load()) {
      const int64_t step = next_step.fetch_add(1);
      const auto start = Clock::now();
      absl::Status st;
      if (train) {
        if (measuring.load() && times_start[0].steps == 0) times_start[0] = dlrm->step_times();
        st = dlrm->NextStep(&train_sources[0], step).status();
        if (measuring.load()) times_end[0] = dlrm->step_times();
      } else {
        st = TableStep(pool[(step + index) % pool.size()], step, out, grads);
      }
      if (!st.ok()) {
        Fail(st);
        break;
      }
      if (measuring.load()) {
        mine.push_back(Seconds(Clock::now() - start) * 1e3);
        const int64_t done = steps.fetch_add(1) + 1;
        if (s.max_steps() > 0 && done >= s.max_steps()) stop = true;
      }
    }
    absl::MutexLock lock(&mu);
    step_ms.insert(step_ms.end(), mine.begin(), mine.end());
  }

  // Data-parallel training: worker w's loop. Collectives need every worker to take the
  // same steps: they run until `stop_at`, which the main thread sets a few steps past the
  // furthest worker (sync pushes keep the workers within a step of each other).
  void DataParallelLoop(int w) {
    trainer::Trainer* t = w == 0 ? dlrm.get() : workers[w].trainer.get();
    std::vector<double> mine;
    for (int64_t step = 0; step < stop_at.load(); ++step) {
      const bool measured = measuring.load();
      if (measured && times_start[w].steps == 0) times_start[w] = t->step_times();
      const auto start = Clock::now();
      absl::Status st = t->NextStep(&train_sources[w], step).status();
      if (!st.ok()) {
        Fail(Annotate(st, absl::StrCat("worker ", w)));
        break;
      }
      int64_t f = furthest.load();
      while (step + 1 > f && !furthest.compare_exchange_weak(f, step + 1)) {
      }
      if (measured && measuring.load()) {
        times_end[w] = t->step_times();
        if (w == 0) mine.push_back(Seconds(Clock::now() - start) * 1e3);
        steps.fetch_add(1);
      }
    }
    absl::MutexLock lock(&mu);
    step_ms.insert(step_ms.end(), mine.begin(), mine.end());
  }

  // Starts the loops, warms up, measures for the scenario's time (or steps), and stops
  // them. Fills r.seconds, r.steps and the CPU time every process had before.
  absl::Status Measure() {
    for (int w = 0; w < s.workers(); ++w) {
      train_sources.emplace_back(&train_batches, w, s.workers());
    }
    times_start.resize(s.workers());
    times_end.resize(s.workers());
    pids = {getpid()};
    names = {"tessera-bench"};
    if (cluster != nullptr) {
      for (const auto& p : cluster->processes()) servers.emplace_back(p.name, p.pid);
    }
    for (const auto& [name, pid] : servers) {
      pids.push_back(pid);
      names.push_back(name);
    }
    std::vector<std::thread> loops;
    if (s.workers() > 1) {
      for (int w = 0; w < s.workers(); ++w) loops.emplace_back([this, w] { DataParallelLoop(w); });
    } else {
      for (int i = 0; i < threads; ++i) loops.emplace_back([this, i] { WorkerLoop(i); });
    }
    Progress(absl::StrFormat("warming up %.1f s", s.warmup_seconds()));
    const auto warm_start = Clock::now();
    while (!stop.load() && Seconds(Clock::now() - warm_start) < s.warmup_seconds()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (pid_t p : pids) {
      ResetPeakRss(p);  // peaks of this scenario only (the harness runs many)
      cpu_before.push_back(ReadProcessUsage(p).cpu_seconds);
    }
    timed->set_recording(true);
    measuring = true;
    const auto start = Clock::now();
    double last_report = 0;
    while (!stop.load()) {
      const double elapsed = Seconds(Clock::now() - start);
      if (elapsed >= s.seconds()) break;
      if (elapsed - last_report >= 1.0) {
        last_report = elapsed;
        Progress(absl::StrFormat("%.0f s, %lld steps, %.0f samples/s", elapsed,
                                 static_cast<long long>(steps.load()),
                                 steps.load() * s.batch_size() / elapsed));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    measuring = false;
    r.seconds = Seconds(Clock::now() - start);
    r.steps = steps.load();
    stop = true;
    stop_at = furthest.load() + 4;
    for (auto& t : loops) t.join();
    if (train) {  // the pushes still in flight of a pipelined run
      absl::Status drained = dlrm->Drain();
      for (int w = 1; w < s.workers() && drained.ok(); ++w) drained = workers[w].trainer->Drain();
      if (failure.ok() && !drained.ok()) failure = drained;
    }
    timed->set_recording(false);
    if (!failure.ok()) return Annotate(failure, absl::StrCat("scenario '", s.name(), "'"));
    return absl::OkStatus();
  }

  // Rates, latencies, per-process figures and the ceilings measured in the same run.
  absl::Status Figures() {
    double cpu = 0;
    for (size_t i = 0; i < pids.size(); ++i) {
      const ProcessUsage u = ReadProcessUsage(pids[i]);
      ProcessFigures f;
      f.name = names[i];
      f.peak_rss_bytes = u.peak_rss_bytes;
      f.cpu_seconds = u.cpu_seconds - cpu_before[i];
      cpu += f.cpu_seconds;
      r.processes.push_back(f);
    }
    r.samples = r.steps * s.batch_size();
    r.samples_per_s = r.samples / r.seconds;
    r.lookups_per_s = r.steps * step_lookups / r.seconds;
    r.updates_per_s = r.steps * step_updates / r.seconds;
    r.payload_bytes_per_s = r.steps * step_bytes / r.seconds;
    r.cpu_us_per_sample = r.samples > 0 ? cpu / r.samples * 1e6 : 0;
    const double ps[3] = {50, 99, 99.9};
    std::vector<double> calls = timed->TakeCallMs();
    for (int i = 0; i < 3; ++i) {
      r.step_ms[i] = Percentile(step_ms, ps[i]);
      r.call_ms[i] = Percentile(calls, ps[i]);
    }
    r.memcpy_bytes_per_s = MemcpyBytesPerSecond(table_bytes, step_bytes);
    r.table_bytes = table_bytes;
    r.llc_bytes = std::max<int64_t>(0, sysconf(_SC_LEVEL3_CACHE_SIZE));
    r.vs_memcpy = r.memcpy_bytes_per_s > 0 ? r.payload_bytes_per_s / r.memcpy_bytes_per_s : 0;
    if (s.mode() == "coordinator" || s.mode() == "smart") {
      // One lookup call of the first table: its ids out, its rows back.
      const int64_t rows_back = pooled ? s.batch_size() : ids_per_table;
      const EchoCeiling echo = MeasureEcho(ids_per_table * 8, rows_back * work[0].dim * 4);
      r.echo_bytes_per_s = echo.unary_bytes_per_s;
      r.echo_stream_bytes_per_s = echo.stream_bytes_per_s;
      r.vs_echo = r.echo_bytes_per_s > 0 ? r.payload_bytes_per_s / r.echo_bytes_per_s : 0;
    }
    if (train) TESSERA_RETURN_IF_ERROR(TrainingFigures());
    if (r.usd_per_hour > 0 && r.samples_per_s > 0) {
      r.usd_per_million_samples = r.usd_per_hour / 3600.0 / r.samples_per_s * 1e6;
    }
    return absl::OkStatus();
  }

  // Where a training step's time went, and the dense compute ceiling.
  absl::Status TrainingFigures() {
    // Per step, the mean over the workers of what their measured steps spent.
    trainer::StepTimes d;
    for (int w = 0; w < s.workers(); ++w) {
      d.steps += times_end[w].steps - times_start[w].steps;
      d.lookup += times_end[w].lookup - times_start[w].lookup;
      d.dense += times_end[w].dense - times_start[w].dense;
      d.grads += times_end[w].grads - times_start[w].grads;
      d.optimizer += times_end[w].optimizer - times_start[w].optimizer;
      d.allreduce += times_end[w].allreduce - times_start[w].allreduce;
      d.push += times_end[w].push - times_start[w].push;
      d.sparse_work += times_end[w].sparse_work - times_start[w].sparse_work;
      d.wall += times_end[w].wall - times_start[w].wall;
    }
    if (d.steps > 0) {
      const double ms = 1e3 / static_cast<double>(d.steps);
      r.lookup_ms = d.lookup * ms;
      r.dense_ms = (d.dense + d.optimizer) * ms;
      r.grads_ms = d.grads * ms;
      r.allreduce_ms = d.allreduce * ms;
      r.push_ms = d.push * ms;
      r.sparse_work_ms = d.sparse_work * ms;
      r.train_step_ms = d.wall * ms;
    }
    if (r.steps == 0) return absl::OkStatus();
    const int batch = s.batch_size();  // per worker
    if (s.dense_backend() == "cuda") {
      TESSERA_ASSIGN_OR_RETURN(const double gemm_s,
                               trainer::CudaDlrmGemmSeconds(model, batch, /*repeats=*/50));
      r.gemm_gflops = StepFlops(model, batch) / gemm_s / 1e9;
    } else {
      r.gemm_gflops = GemmGflops(model, batch);
    }
    r.step_gflops = StepFlops(model, batch) * r.steps / r.seconds / 1e9;
    r.vs_gemm = r.step_gflops / r.gemm_gflops;
    if (r.dense_ms > 0) {
      r.dense_samples_per_s = batch / (r.dense_ms / 1e3);
      r.dense_vs_gemm = StepFlops(model, batch) / (r.dense_ms / 1e3) / 1e9 / r.gemm_gflops;
    }
    return absl::OkStatus();
  }

  const RunOptions& options_;
  ScenarioResult r;
  Scenario& s = r.scenario;  // with defaults filled in

  // Where the tables live.
  std::unique_ptr<LocalCluster> cluster;
#if TESSERA_HAVE_HIREDIS
  std::unique_ptr<RedisServer> redis;
#endif
  std::shared_ptr<base::ThreadPool> sparse_pool;  // the tables' and the trainers'
  std::unique_ptr<embedding::EmbeddingCollection> tables;
  std::unique_ptr<TimedCollection> timed;
  std::vector<std::pair<std::string, pid_t>> servers;  // processes besides this one
  client::ClientOptions co;                            // cluster modes

  // The workload.
  v1::OptimizerType opt{};
  std::vector<TableWork> work;
  int64_t table_bytes = 0, max_rows = 0;
  bool train = false, lookups = false, updates = false, pooled = false;
  int threads = 1;
  int ids_per_table = 0;
  int64_t step_bytes = 0, step_lookups = 0, step_updates = 0;
  std::vector<IdBatch> pool;  // lookup and update workloads

  // Training.
  trainer::DlrmConfig model;
  std::unique_ptr<trainer::DenseBackend> dense;
  std::vector<BenchWorker> workers;  // workers > 1; worker 0's trainer is dlrm
  std::unique_ptr<trainer::CoordinatorRendezvous> rendezvous;
  std::unique_ptr<trainer::Trainer> dlrm;  // after what it uses: destroyed before them
  std::vector<trainer::Batch> train_batches;
  std::vector<PoolSource> train_sources;  // per worker
  // Each trainer's StepTimes when the measured phase starts and ends.
  std::vector<trainer::StepTimes> times_start, times_end;

  // The measured loop.
  std::vector<pid_t> pids;
  std::vector<std::string> names;
  std::vector<double> cpu_before;
  std::atomic<bool> measuring{false}, stop{false};
  std::atomic<int64_t> steps{0}, next_step{0};
  std::atomic<int64_t> stop_at{std::numeric_limits<int64_t>::max()}, furthest{0};
  // Written by the loops under mu; read once they have ended.
  absl::Mutex mu;
  std::vector<double> step_ms;
  absl::Status failure;
};

}  // namespace

absl::StatusOr<ScenarioResult> RunScenario(const Scenario& input, const RunOptions& options) {
  ScenarioRun run(input, options);
  return run.Run();
}

}  // namespace tessera::bench
