// Micro-benchmarks of the embedding core, each next to its memory ceiling measured in
// the same process: every benchmark reports `vs_memcpy`, its bytes/s over the bytes/s of
// memcpy moving the same bytes from a buffer of the same size as the table.
//
// Sizes: "llc" tables fit in a quarter of the last-level cache, "8xllc" tables are eight
// times it and at least 1 GiB of rows (override the cache size with
// TESSERA_BENCH_LLC_BYTES). Ids are uniform or
// Zipf(1.05) over the table's rows.
//
// Gather and the Adagrad update also report `vs_flat`: their bytes/s over the same work
// on the same ids' rows in a flat array (row = id; no id map, no locks; see FlatRows),
// the random-access ceiling of this machine, which memcpy's sequential streaming is not.
// The table and the flat array take turns batch by batch (PairedLoop), so that drifts of
// a shared machine's memory bandwidth fall on both; the reported time is the table's.
//
// Bytes counted: gather and pooled lookup count dim * 4 bytes per id read; an update
// counts the optimizer's read + write traffic per unique row (Adagrad: read w, acc, g and
// write w, acc = 5 * dim * 4; Adam: 7 * dim * 4), compared with memcpy's read + write
// traffic (2x the bytes copied); Unique counts 8 bytes per id.

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "base/zipf_sampler.h"
#include "benchmark/benchmark.h"
#include "benchmarks/memcpy_ceiling.h"
#include "embedding/batch_ops.h"
#include "embedding/collection.h"
#include "embedding/embedding_table.h"
#include "embedding/inprocess_collection.h"
#include "embedding/prefetch.h"

namespace tessera::embedding {
namespace {

constexpr int kBatch = 4096;
// "8xllc" tables hold at least this many bytes of rows, so that machines reporting a
// small and a large L3 both measure tables far out of cache.
constexpr int64_t kMinBigBytes = int64_t{1} << 30;
constexpr int kBagSize = 8;

int64_t LlcBytes() {
  if (const char* env = std::getenv("TESSERA_BENCH_LLC_BYTES")) return std::atoll(env);
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? l3 : 32LL << 20;
}

// Batches of ids a benchmark cycles through for rows of `row_bytes`: enough that the rows
// they name span eight times the last-level cache (at least 64 batches), so that neither
// a table nor the flat ceiling finds rows of an earlier round still in cache. (Rows of a
// few batches recycled fit a 32 MiB cache whole and measure it, not memory.)
int IdBatches(int64_t row_bytes) {
  const int64_t want = 8 * LlcBytes() / (static_cast<int64_t>(kBatch) * row_bytes);
  return static_cast<int>(std::clamp<int64_t>(want, 64, 4096));
}

// Bytes a row of fp32 weights of this shape occupies in the table: weights, state and
// meta (its map slot aside).
int64_t RowBytes(int dim, int state_floats) { return int64_t{dim + state_floats} * 4 + 8; }

int StateFloats(v1::OptimizerType opt, int dim) {
  switch (opt) {
    case v1::ADAGRAD:
      return dim;
    case v1::ADAM:
      return 2 * dim;
    default:
      return 0;
  }
}

// Stops the benchmark on a failed table call: figures from calls that returned early
// would say nothing.
void CheckOk(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::abort();
  }
}

// One table at a time stays alive: building the 8xllc ones takes seconds and gigabytes.
struct Fixture {
  v1::OptimizerType opt = v1::OPTIMIZER_UNSPECIFIED;
  int dim = 0;
  bool big = false;
  bool fixed = false;  // a fixed-vocabulary table (rows addressed by id)
  int64_t rows = 0;
  std::unique_ptr<EmbeddingTable> table;
  std::unique_ptr<EmbeddingCollection> collection;  // same rows, for pooled lookups
};

// Bytes a row of a fixed-vocabulary table takes: its weights and state, unpadded.
int64_t FixedRowBytes(int dim, int state_floats) { return int64_t{dim + state_floats} * 4; }

Fixture& GetTable(v1::OptimizerType opt, int dim, bool big, bool want_collection,
                  bool fixed = false) {
  static Fixture f;
  if (f.table && f.opt == opt && f.dim == dim && f.big == big && f.fixed == fixed &&
      (!want_collection || f.collection)) {
    return f;
  }
  f = Fixture();
  const int64_t budget = big ? std::max<int64_t>(8 * LlcBytes(), kMinBigBytes) : LlcBytes() / 4;
  f.opt = opt;
  f.dim = dim;
  f.big = big;
  f.fixed = fixed;
  const int64_t row_bytes = fixed ? FixedRowBytes(dim, StateFloats(opt, dim))
                                  : RowBytes(dim, StateFloats(opt, dim));
  f.rows = std::max<int64_t>(1024, budget / row_bytes);
  v1::TableConfig c;
  c.set_name("bench");
  c.set_dim(dim);
  c.mutable_optimizer()->set_type(opt);
  if (fixed) c.set_vocabulary_size(f.rows);
  auto t = EmbeddingTable::Create(c);
  f.table = std::move(t).value();
  std::vector<int64_t> ids(65536);
  std::vector<float> out(ids.size() * dim);
  const std::vector<float> zeros(ids.size() * dim, 0.0f);
  for (int64_t begin = 0; begin < f.rows; begin += ids.size()) {
    const int64_t n = std::min<int64_t>(ids.size(), f.rows - begin);
    for (int64_t i = 0; i < n; ++i) ids[i] = begin + i;
    // A fixed vocabulary stores rows on their first update, not on lookups.
    CheckOk(fixed
                ? f.table->ApplyUniqueGradients(absl::MakeConstSpan(ids).first(n), zeros.data(), 0)
                : f.table->Lookup(absl::MakeConstSpan(ids).first(n), out.data()),
            "filling the table");
  }
  if (f.table->num_rows() != f.rows) {
    std::fprintf(stderr, "the table holds %lld rows, not %lld\n",
                 static_cast<long long>(f.table->num_rows()), static_cast<long long>(f.rows));
    std::abort();
  }
  if (want_collection) {
    f.collection = NewInProcessCollection(1).value();
    CheckOk(f.collection->CreateTable(c), "creating the collection's table");
    for (int64_t begin = 0; begin < f.rows; begin += ids.size()) {
      const int64_t n = std::min<int64_t>(ids.size(), f.rows - begin);
      for (int64_t i = 0; i < n; ++i) ids[i] = begin + i;
      CheckOk(f.collection->Lookup("bench", absl::MakeConstSpan(ids).first(n),
                                   absl::MakeSpan(out).first(n * dim)),
              "filling the collection's table");
    }
  }
  return f;
}

// `count` ids over [0, rows): uniform, or Zipf(1.05) (base::ZipfSampler, as tessera-bench).
std::vector<int64_t> MakeIds(int64_t rows, bool zipf, int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const base::ZipfSampler ranks(rows, 1.05);
  std::vector<int64_t> ids(count);
  for (auto& id : ids) {
    if (zipf) {
      id = ranks(rng) - 1;
      // Spread popular ranks over the id space as real feature hashes are.
      id = static_cast<int64_t>((static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ULL) % rows);
    } else {
      id = static_cast<int64_t>(rng() % rows);
    }
  }
  return ids;
}

using bench::MemcpyBytesPerSecond;

// The random-access ceiling of a table operation: the same ids' rows in a flat array, row
// `id` at `id * stride` bytes (huge pages, as the table's arrays), with no id map and no
// locks, 16 rows prefetched ahead. Gather copies each row's `dim` weights out; Update gives
// each row's first `dim` floats (weights) and the `dim` after them (accumulator) an Adagrad
// step. The table's operation and the flat one run in turn on the same batches
// (PairedLoop): on a shared VM memory bandwidth drifts by tens of percent over seconds, so
// a ceiling measured once, apart from the table, moved the ratio more than the table did.
class FlatRows {
 public:
  FlatRows(int64_t rows, int stride, int dim) : rows_(rows), floats_(stride / 4), dim_(dim) {
    const size_t huge = size_t{2} << 20;
    const size_t bytes = (static_cast<size_t>(rows) * stride + huge - 1) / huge * huge;
    block_.reset(static_cast<float*>(std::aligned_alloc(huge, bytes)));
    madvise(block_.get(), bytes, MADV_HUGEPAGE);
    std::fill(block_.get(), block_.get() + static_cast<size_t>(rows) * floats_, 0.5f);
  }

  bool Matches(int64_t rows, int stride, int dim) const {
    return rows_ == rows && floats_ == stride / 4 && dim_ == dim;
  }

  void Gather(absl::Span<const int64_t> ids, float* out) const {
    const int lines = (dim_ * 4 + 63) / 64;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i + kAhead < ids.size()) Prefetch(ids[i + kAhead], lines, /*for_write=*/false);
      std::memcpy(out + i * dim_, Row(ids[i]), sizeof(float) * dim_);
    }
    benchmark::DoNotOptimize(out);
  }

  void Update(absl::Span<const int64_t> ids, const float* grads) const {
    const int lines = (2 * dim_ * 4 + 63) / 64;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i + kAhead < ids.size()) Prefetch(ids[i + kAhead], lines, /*for_write=*/true);
      float* row = Row(ids[i]);
      float* acc = row + dim_;
      const float* g = grads + i * dim_;
      for (int j = 0; j < dim_; ++j) {
        acc[j] += g[j] * g[j];
        row[j] -= 0.01f * g[j] / (std::sqrt(acc[j]) + 1e-10f);
      }
    }
    benchmark::DoNotOptimize(block_.get());
  }

 private:
  static constexpr size_t kAhead = 16;
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  float* Row(int64_t id) const { return block_.get() + static_cast<size_t>(id % rows_) * floats_; }
  void Prefetch(int64_t id, int lines, bool for_write) const {
    embedding::PrefetchLines(Row(id), lines, for_write);
  }

  int64_t rows_;
  int floats_, dim_;
  std::unique_ptr<float, Free> block_;
};

// The flat rows for a table of `rows` rows of `stride` bytes; the last ones are kept (a
// 1 GiB array takes a second to fill).
const FlatRows& GetFlat(int64_t rows, int stride, int dim) {
  static std::unique_ptr<FlatRows> flat;
  if (flat == nullptr || !flat->Matches(rows, stride, dim)) {
    flat.reset();
    flat = std::make_unique<FlatRows>(rows, stride, dim);
  }
  return *flat;
}

// The benchmark loop of an operation with a flat ceiling: `table_op(b)` and `flat_op(b)`
// on batch b = 0, 1, ..., `batches` - 1, 0, ..., in alternating order. The benchmark's
// time is the table's alone (manual time); returns the flat operation's seconds over the
// same batches.
template <typename TableOp, typename FlatOp>
double PairedLoop(benchmark::State& state, int batches, const TableOp& table_op,
                  const FlatOp& flat_op) {
  using Clock = std::chrono::steady_clock;
  double flat_seconds = 0;
  int b = 0;
  bool table_first = true;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    if (table_first) {
      table_op(b);
    } else {
      flat_op(b);
    }
    const auto t1 = Clock::now();
    if (table_first) {
      flat_op(b);
    } else {
      table_op(b);
    }
    const auto t2 = Clock::now();
    const double first = std::chrono::duration<double>(t1 - t0).count();
    const double second = std::chrono::duration<double>(t2 - t1).count();
    state.SetIterationTime(table_first ? first : second);
    flat_seconds += table_first ? second : first;
    table_first = !table_first;
    b = (b + 1) % batches;
  }
  return flat_seconds;
}

// The flat operation's bytes/s over a PairedLoop of `bytes_per_iter` an iteration.
double FlatBytesPerSecond(const benchmark::State& state, int64_t bytes_per_iter,
                          double flat_seconds) {
  return flat_seconds > 0 ? static_cast<double>(state.iterations()) * bytes_per_iter / flat_seconds
                          : 0;
}

void Report(benchmark::State& state, int64_t bytes_per_iter, double ceiling_bytes_per_s,
            double flat_bytes_per_s = 0) {
  state.SetBytesProcessed(state.iterations() * bytes_per_iter);
  state.counters["memcpy_GBps"] = ceiling_bytes_per_s / 1e9;
  state.counters["vs_memcpy"] =
      benchmark::Counter(static_cast<double>(bytes_per_iter) / ceiling_bytes_per_s,
                         benchmark::Counter::kIsIterationInvariantRate);
  if (flat_bytes_per_s > 0) {
    state.counters["flat_GBps"] = flat_bytes_per_s / 1e9;
    state.counters["vs_flat"] =
        benchmark::Counter(static_cast<double>(bytes_per_iter) / flat_bytes_per_s,
                           benchmark::Counter::kIsIterationInvariantRate);
  }
}

// A gather of 4,096 ids a batch against a flat gather over rows of the table's stride:
// a dynamic table's (padded rows), or a fixed-vocabulary table's (rows addressed by id,
// its weights unpadded). Args: dim, zipf (0/1), big (0/1).
void RunGather(benchmark::State& state, bool fixed) {
  const int dim = state.range(0);
  Fixture& f = GetTable(v1::SGD, dim, state.range(2), false, fixed);
  const int kBatches = IdBatches(int64_t{dim} * 4);
  std::vector<int64_t> ids = MakeIds(f.rows, state.range(1), kBatch * kBatches, 1);
  std::vector<float> out(static_cast<size_t>(kBatch) * dim);
  const int64_t bytes = static_cast<int64_t>(kBatch) * dim * 4;
  const int64_t row = fixed ? FixedRowBytes(dim, 0) : RowBytes(dim, 0);
  const double ceiling = MemcpyBytesPerSecond(f.rows * row, bytes);
  const FlatRows& flat = GetFlat(f.rows, static_cast<int>(row), dim);
  std::vector<float> flat_out(out.size());
  auto batch = [&](int b) {
    return absl::MakeConstSpan(ids).subspan(static_cast<size_t>(b) * kBatch, kBatch);
  };
  const double flat_seconds = PairedLoop(
      state, kBatches,
      [&](int b) { benchmark::DoNotOptimize(f.table->Lookup(batch(b), out.data())); },
      [&](int b) { flat.Gather(batch(b), flat_out.data()); });
  Report(state, bytes, ceiling, FlatBytesPerSecond(state, bytes, flat_seconds));
  state.counters["rows"] = f.rows;
}

void BM_Gather(benchmark::State& state) { RunGather(state, /*fixed=*/false); }
void BM_FixedGather(benchmark::State& state) { RunGather(state, /*fixed=*/true); }

void BM_PooledLookup(benchmark::State& state) {
  const int dim = state.range(0);
  Fixture& f = GetTable(v1::SGD, dim, state.range(2), true);
  const int kBatches = 32;
  std::vector<int64_t> ids = MakeIds(f.rows, state.range(1), kBatch * kBatches, 2);
  std::vector<int32_t> offsets;
  for (int i = 0; i <= kBatch / kBagSize; ++i) offsets.push_back(i * kBagSize);
  std::vector<float> out(static_cast<size_t>(kBatch / kBagSize) * dim);
  const int64_t bytes = static_cast<int64_t>(kBatch) * dim * 4;
  const double ceiling = MemcpyBytesPerSecond(f.rows * RowBytes(dim, 0), bytes);
  int b = 0;
  for (auto _ : state) {
    auto span = absl::MakeConstSpan(ids).subspan(static_cast<size_t>(b) * kBatch, kBatch);
    benchmark::DoNotOptimize(
        f.collection->PooledLookup("bench", span, offsets, {}, v1::SUM, absl::MakeSpan(out)));
    b = (b + 1) % kBatches;
  }
  Report(state, bytes, ceiling);
}

void RunUpdate(benchmark::State& state, v1::OptimizerType opt, int traffic_floats_per_dim,
               bool fixed = false) {
  const int dim = state.range(0);
  Fixture& f = GetTable(opt, dim, state.range(2), false, fixed);
  const int64_t row_bytes = fixed ? FixedRowBytes(dim, StateFloats(opt, dim))
                                  : RowBytes(dim, StateFloats(opt, dim));
  const int kBatches = IdBatches(row_bytes);
  std::vector<std::vector<int64_t>> batches;
  size_t unique_total = 0;
  for (int b = 0; b < kBatches; ++b) {
    std::vector<int64_t> raw = MakeIds(f.rows, state.range(1), kBatch, 100 + b);
    std::vector<int64_t> u;
    std::vector<int32_t> inv;
    Unique(raw, &u, &inv);
    unique_total += u.size();
    batches.push_back(std::move(u));
  }
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> g(-1e-3f, 1e-3f);
  std::vector<float> grads(static_cast<size_t>(kBatch) * dim);
  for (auto& v : grads) v = g(rng);
  const int64_t avg_unique = static_cast<int64_t>(unique_total / kBatches);
  const int64_t traffic = avg_unique * traffic_floats_per_dim * dim * 4;
  // memcpy traffic is read + write: twice the bytes it copies.
  const double ceiling =
      2 * MemcpyBytesPerSecond(f.rows * row_bytes, traffic / 2);
  int64_t step = 0;
  auto table_op = [&](int b) {
    benchmark::DoNotOptimize(f.table->ApplyUniqueGradients(batches[b], grads.data(), step++));
  };
  double flat_bytes_per_s = 0;
  if (opt == v1::ADAGRAD) {
    // Adagrad's flat ceiling (Adam's does more math on the same kind of traffic).
    const FlatRows& flat = GetFlat(f.rows, static_cast<int>(row_bytes), dim);
    const double flat_seconds = PairedLoop(state, kBatches, table_op, [&](int b) {
      flat.Update(batches[b], grads.data());
    });
    flat_bytes_per_s = FlatBytesPerSecond(state, traffic, flat_seconds);
  } else {
    for (auto _ : state) {
      const auto t0 = std::chrono::steady_clock::now();
      table_op(static_cast<int>(step % kBatches));
      state.SetIterationTime(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  Report(state, traffic, ceiling, flat_bytes_per_s);
  state.counters["unique_rows"] = avg_unique;
}

void BM_AdagradUpdate(benchmark::State& state) { RunUpdate(state, v1::ADAGRAD, 5); }
void BM_AdamUpdate(benchmark::State& state) { RunUpdate(state, v1::ADAM, 7); }
void BM_FixedAdagradUpdate(benchmark::State& state) {
  RunUpdate(state, v1::ADAGRAD, 5, /*fixed=*/true);
}

// Args: batch, zipf.
void BM_Unique(benchmark::State& state) {
  const int n = state.range(0);
  std::vector<int64_t> ids = MakeIds(int64_t{1} << 24, state.range(1), n, 4);
  std::vector<int64_t> u;
  std::vector<int32_t> inv;
  const int64_t bytes = static_cast<int64_t>(n) * 8;
  const double ceiling = MemcpyBytesPerSecond(bytes, bytes);
  for (auto _ : state) {
    Unique(ids, &u, &inv);
    benchmark::DoNotOptimize(u.data());
  }
  Report(state, bytes, ceiling);
  state.counters["unique"] = u.size();
}

void TableArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"dim", "zipf", "8xllc"});
  // Grouped by table so each table is built once.
  for (int big : {0, 1}) {
    for (int dim : {16, 64, 256}) {
      for (int zipf : {0, 1}) b->Args({dim, zipf, big});
    }
  }
}

BENCHMARK(BM_Gather)->Apply(TableArgs)->MinTime(0.5)->UseManualTime();
BENCHMARK(BM_PooledLookup)->Apply(TableArgs)->MinTime(0.5)->UseRealTime();
BENCHMARK(BM_FixedGather)->Apply(TableArgs)->MinTime(0.5)->UseManualTime();
BENCHMARK(BM_FixedAdagradUpdate)->Apply(TableArgs)->MinTime(0.5)->UseManualTime();
BENCHMARK(BM_AdagradUpdate)->Apply(TableArgs)->MinTime(0.5)->UseManualTime();
BENCHMARK(BM_AdamUpdate)->Apply(TableArgs)->MinTime(0.5)->UseManualTime();
BENCHMARK(BM_Unique)
    ->ArgNames({"batch", "zipf"})
    ->ArgsProduct({{4096, 65536}, {0, 1}})
    ->MinTime(0.5)
    ->UseRealTime();

}  // namespace
}  // namespace tessera::embedding

// main() is benchmark_main.cc.
