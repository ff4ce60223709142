// A training step's table work alone (trainer::SparseStep: the pooled lookup, the
// embedding gradients, the push) on an in-process collection, next to what the tables
// themselves take for the same ids in the same run: EmbeddingTable::Lookup of the batch's
// ids and the optimizer's update of its distinct rows (`vs_tables`: the path's ns per id
// over the tables' own). Then the same path on more threads (`vs_one_thread`).
//
//   tessera-sparse-step-benchmark --tables=26 --rows=100000 --batch=2048 --threads=1,2
//
// Every row exists before the timing (as in a long run) and every step has a batch of
// its own (Zipf ids from trainer::SyntheticGenerator), so nothing is replayed from cache.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/command_line.h"
#include "base/thread_pool.h"
#include "embedding/batch_ops.h"
#include "embedding/embedding_table.h"
#include "embedding/inprocess_collection.h"
#include "trainer/sparse_step.h"
#include "trainer/synthetic.h"
#include "trainer/trainer.h"

ABSL_FLAG(int, tables, 26, "tables (sparse features)");
ABSL_FLAG(int64_t, rows, 100000, "rows per table (every one created before the timing)");
ABSL_FLAG(int, dim, 16, "embedding dimension");
ABSL_FLAG(int, batch, 2048, "samples per step, one id per table each");
ABSL_FLAG(int, shards, 4, "in-process shards");
ABSL_FLAG(int, steps, 100, "timed steps, each with a batch of its own");
ABSL_FLAG(double, zipf, 1.1, "Zipf exponent of id popularity");
ABSL_FLAG(std::string, threads, "1,2", "thread counts to time the path with; 0 = every CPU");
ABSL_FLAG(int, repeats, 3, "rounds of every measurement; each figure is the median round's");

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Setup {
  int tables, dim, batch, shards, steps;
  int64_t rows;
  std::vector<std::string> names;
  std::vector<trainer::Batch> batches;  // one per step
  std::vector<std::vector<int64_t>> all_ids;  // [table] every id of the table
  std::vector<float> emb_grad;          // (tables, batch, dim): the dense network's output
  int64_t ids_per_step = 0;
};

v1::TableConfig TableConfigOf(const Setup& s, const std::string& name, int f) {
  v1::TableConfig c;
  c.set_name(name);
  c.set_dim(s.dim);
  c.set_seed(7 + f);
  c.mutable_optimizer()->set_type(v1::ADAGRAD);
  c.mutable_optimizer()->set_learning_rate(0.05f);
  return c;
}

// Times `what` per step and returns seconds summed over the steps, phase by phase.
struct PhaseSeconds {
  double lookup = 0, grads = 0, push = 0;
  double total() const { return lookup + grads + push; }
};

// The tables' own work for the same ids, in the step's order: a gather of every id of the
// batch from every table, then the optimizer's update of each table's distinct ids with
// their summed gradients (computed untimed in between, as the dense step would).
PhaseSeconds TimeTablesOwn(const Setup& s) {
  std::vector<std::unique_ptr<embedding::EmbeddingTable>> tables;
  for (int f = 0; f < s.tables; ++f) {
    tables.push_back(embedding::EmbeddingTable::Create(TableConfigOf(s, s.names[f], f)).value());
    std::vector<float> out(s.all_ids[f].size() * s.dim);
    (void)tables[f]->Lookup(s.all_ids[f], out.data(), /*insert_missing=*/true);
  }
  PhaseSeconds t;
  const size_t block = static_cast<size_t>(s.batch) * s.dim;
  std::vector<float> out(block * s.tables);
  std::vector<std::vector<int64_t>> unique(s.tables);
  std::vector<int32_t> inverse;
  std::vector<std::vector<float>> grads(s.tables);
  for (int step = 0; step < s.steps; ++step) {
    const trainer::Batch& b = s.batches[step];
    auto start = Clock::now();
    for (int f = 0; f < s.tables; ++f) {
      (void)tables[f]->Lookup(b.ids[f], out.data() + f * block, /*insert_missing=*/true);
    }
    t.lookup += Since(start);
    for (int f = 0; f < s.tables; ++f) {
      embedding::Unique(b.ids[f], &unique[f], &inverse);
      grads[f].resize(unique[f].size() * s.dim);
      embedding::PoolBagsBackward(s.emb_grad.data() + f * block, s.dim, inverse, b.offsets[f], {},
                                  v1::SUM, unique[f].size(), grads[f].data());
    }
    start = Clock::now();
    for (int f = 0; f < s.tables; ++f) {
      (void)tables[f]->ApplyCheckedGradients(unique[f], grads[f].data(), step);
    }
    t.push += Since(start);
  }
  return t;
}

// The trainer's path: SparseStep's lookup, gradients and push through the collection.
PhaseSeconds TimePath(const Setup& s, int threads) {
  auto pool = std::make_shared<base::ThreadPool>(threads);
  embedding::InProcessOptions options;
  options.num_shards = s.shards;
  options.pool = pool;
  auto tables = embedding::NewInProcessCollection(options).value();
  for (int f = 0; f < s.tables; ++f) {
    (void)tables->CreateTable(TableConfigOf(s, s.names[f], f));
    std::vector<float> out(s.all_ids[f].size() * s.dim);
    (void)tables->Lookup(s.names[f], s.all_ids[f], absl::MakeSpan(out));
  }
  trainer::SparseStep sparse;
  std::vector<float> emb(static_cast<size_t>(s.tables) * s.batch * s.dim);
  PhaseSeconds t;
  for (int step = 0; step < s.steps; ++step) {
    const trainer::Batch& b = s.batches[step];
    auto start = Clock::now();
    absl::Status looked = sparse.Lookup(*tables, s.names, b, s.dim, true, absl::MakeSpan(emb));
    t.lookup += Since(start);
    start = Clock::now();
    sparse.Gradients(s.names, b, s.dim, s.emb_grad.data(), *pool);
    t.grads += Since(start);
    start = Clock::now();
    absl::Status pushed = tables->PushBatch(sparse.pushes(), step);
    t.push += Since(start);
    if (!looked.ok() || !pushed.ok()) {
      std::fprintf(stderr, "step %d: %s %s\n", step, looked.ToString().c_str(),
                   pushed.ToString().c_str());
      std::exit(1);
    }
  }
  return t;
}

Setup MakeSetup() {
  Setup s;
  s.tables = absl::GetFlag(FLAGS_tables);
  s.rows = absl::GetFlag(FLAGS_rows);
  s.dim = absl::GetFlag(FLAGS_dim);
  s.batch = absl::GetFlag(FLAGS_batch);
  s.shards = absl::GetFlag(FLAGS_shards);
  s.steps = absl::GetFlag(FLAGS_steps);
  s.names = trainer::Trainer::TableNames(s.tables);
  trainer::SyntheticConfig sc;
  sc.cardinalities.assign(s.tables, s.rows);
  sc.zipf_s = absl::GetFlag(FLAGS_zipf);
  auto gen = trainer::SyntheticGenerator::Create(sc).value();
  s.batches.resize(s.steps);
  for (int i = 0; i < s.steps; ++i) gen->MakeBatch(i, s.batch, &s.batches[i]);
  s.all_ids.resize(s.tables);
  for (int f = 0; f < s.tables; ++f) {
    for (int64_t r = 0; r < s.rows; ++r) s.all_ids[f].push_back(gen->IdOf(f, r));
  }
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1e-3f, 1e-3f);
  s.emb_grad.resize(static_cast<size_t>(s.tables) * s.batch * s.dim);
  for (float& g : s.emb_grad) g = u(rng);
  for (int f = 0; f < s.tables; ++f) s.ids_per_step += s.batches[0].ids[f].size();
  return s;
}

// The run of the median total among `runs` (each phase from that same run).
PhaseSeconds Median(std::vector<PhaseSeconds> runs) {
  std::sort(runs.begin(), runs.end(),
            [](const PhaseSeconds& a, const PhaseSeconds& b) { return a.total() < b.total(); });
  return runs[runs.size() / 2];
}

int Run() {
  const Setup s = MakeSetup();
  const double ids = static_cast<double>(s.ids_per_step) * s.steps;
  auto ns = [&](double seconds) { return seconds * 1e9 / ids; };
  std::vector<int> counts;
  for (absl::string_view t : absl::StrSplit(absl::GetFlag(FLAGS_threads), ',')) {
    int threads = 0;
    if (!absl::SimpleAtoi(t, &threads) || !base::ResolveThreads(threads, &threads).ok()) {
      std::fprintf(stderr, "--threads: bad count '%s'\n", std::string(t).c_str());
      return 1;
    }
    counts.push_back(threads);
  }
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  std::printf("tables %d x %lld rows x dim %d (adagrad), %d in-process shards, batch %d, %d steps "
              "of their own batches (%lld ids a step), the median of %d rounds\n",
              s.tables, static_cast<long long>(s.rows), s.dim, s.shards, s.batch, s.steps,
              static_cast<long long>(s.ids_per_step), repeats);
  // Rounds of every measurement in turn, so that a slow spell of a shared machine lands on
  // all of them alike.
  std::vector<PhaseSeconds> own_runs;
  std::vector<std::vector<PhaseSeconds>> path_runs(counts.size());
  for (int r = 0; r < repeats; ++r) {
    own_runs.push_back(TimeTablesOwn(s));
    for (size_t c = 0; c < counts.size(); ++c) path_runs[c].push_back(TimePath(s, counts[c]));
  }
  const PhaseSeconds own = Median(own_runs);
  std::printf("tables' own, 1 thread:  gather %6.1f ns/id  update %6.1f ns/id  sum %6.1f ns/id\n",
              ns(own.lookup), ns(own.push), ns(own.total()));
  double one_thread = 0;
  for (size_t c = 0; c < counts.size(); ++c) {
    const int threads = counts[c];
    const PhaseSeconds path = Median(path_runs[c]);
    if (one_thread == 0 && threads == 1) one_thread = path.total();
    const std::string scaling =
        one_thread > 0 && threads != 1
            ? absl::StrFormat("  vs_one_thread %.2f", path.total() / one_thread)
            : "";
    std::printf(
        "path, %2d thread(s):     lookup %6.1f ns/id  grads %6.1f  push %6.1f  sum %6.1f ns/id  "
        "(%.2f ms a step)  vs_tables %.2f%s\n",
        threads, ns(path.lookup), ns(path.grads), ns(path.push), ns(path.total()),
        path.total() * 1e3 / s.steps, path.total() / own.total(), scaling.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::base::ParseCommandLine(argc, argv, "tessera-sparse-step-benchmark",
                                  "Times a training step's table work against the tables' own.");
  return tessera::Run();
}
