// A serving replica's Predict without the network (serving::PooledEmbeddings over 26
// ServingTables, then serving::DenseModel::Forward: what Replica::Predict computes) next to
// its ceiling measured in the same run: the trainer's own forward pass (the CPU dense
// backend's Forward on the same embeddings), for the default run's DLRM (bottom MLP
// 13-64-32-16, top MLP 367-64-32-1) at batch 1, 64 and 512, each with `samples_per_s`:
// Predict's rate over the forward pass's is how close it comes to its ceiling.
//
//   tessera-predict-benchmark [--benchmark_filter=...]
//
// Each table holds 100,000 rows; every call scores a batch of its own (64 batches
// rotate), Zipf ids, so the rows are not replayed from one cache-warm batch.

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "embedding/serving_table.h"
#include "serving/dense_model.h"
#include "trainer/dense_backend.h"
#include "trainer/synthetic.h"

namespace tessera {
namespace {

constexpr int kTables = 26;
constexpr int kDim = 16;
constexpr int64_t kRows = 100000;
constexpr int kBatches = 64;

struct Fixture {
  std::vector<std::unique_ptr<embedding::ServingTable>> tables;
  std::vector<const embedding::ServingTable*> views;
  std::shared_ptr<const serving::DenseModel> model;
  std::unique_ptr<trainer::DenseBackend> forward;  // the ceiling: the trainer's backend
  std::vector<trainer::Batch> batches;
};

std::vector<float> RandomFloats(std::mt19937_64& rng, size_t n, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> out(n);
  for (float& x : out) x = u(rng);
  return out;
}

const Fixture& Shared(int batch) {
  static auto* fixtures = new std::vector<std::unique_ptr<Fixture>>(513);
  std::unique_ptr<Fixture>& f = (*fixtures)[batch];
  if (f != nullptr) return *f;
  f = std::make_unique<Fixture>();
  std::mt19937_64 rng(7);
  trainer::DlrmConfig config;
  f->forward = std::move(trainer::NewCpuDenseBackend(config)).value();
  v1::DenseSnapshot snapshot;
  snapshot.set_step(1);
  snapshot.set_num_dense(config.num_dense);
  snapshot.set_emb_dim(config.emb_dim);
  for (int w : config.bottom_mlp) snapshot.add_bottom_mlp(w);
  for (int w : config.top_mlp) snapshot.add_top_mlp(w);
  absl::Span<const float> params = f->forward->Parameters();
  snapshot.set_parameters(params.data(), params.size() * sizeof(float));
  std::vector<int64_t> ids(kRows);
  for (int64_t i = 0; i < kRows; ++i) ids[i] = i;
  for (int t = 0; t < kTables; ++t) {
    v1::TableConfig c;
    c.set_name("m.C" + std::to_string(t + 1));
    c.set_dim(kDim);
    c.set_seed(t);
    snapshot.add_tables(c.name());
    f->tables.push_back(
        std::move(embedding::ServingTable::Create(c, embedding::ServingFormat::kFp32)).value());
    (void)f->tables.back()->Apply(ids, RandomFloats(rng, kRows * kDim, 0.05f));
    f->views.push_back(f->tables.back().get());
  }
  f->model = std::move(serving::DenseModel::Make(snapshot)).value();
  trainer::SyntheticConfig sc;
  sc.cardinalities.assign(kTables, kRows);
  auto data = std::move(trainer::SyntheticGenerator::Create(sc)).value();
  for (int b = 0; b < kBatches; ++b) {
    f->batches.emplace_back();
    data->MakeBatch(b, batch, &f->batches.back());
  }
  return *f;
}

std::vector<serving::FeatureBags> BagsOf(const trainer::Batch& b) {
  std::vector<serving::FeatureBags> bags;
  for (int t = 0; t < kTables; ++t) bags.push_back({b.ids[t], b.offsets[t]});
  return bags;
}

void BM_ReplicaPredict(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  const Fixture& f = Shared(batch);
  std::vector<float> emb(kTables * batch * kDim), logits(batch);
  int i = 0;
  for (auto _ : state) {
    const trainer::Batch& b = f.batches[i++ % kBatches];
    benchmark::DoNotOptimize(
        serving::PooledEmbeddings(f.views, BagsOf(b), batch, absl::MakeSpan(emb)).ok());
    benchmark::DoNotOptimize(f.model->Forward(batch, b.dense.data(), emb.data(), logits.data()));
  }
  state.counters["samples_per_s"] =
      benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_TrainerForward(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  const Fixture& f = Shared(batch);
  std::mt19937_64 rng(3);
  const std::vector<float> emb = RandomFloats(rng, kTables * batch * kDim, 0.1f);
  std::vector<float> logits(batch);
  int i = 0;
  for (auto _ : state) {
    const trainer::Batch& b = f.batches[i++ % kBatches];
    benchmark::DoNotOptimize(f.forward->Forward(batch, b.dense.data(), emb.data(), logits.data()));
  }
  state.counters["samples_per_s"] =
      benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_TrainerForward)->Arg(1)->Arg(64)->Arg(512);
BENCHMARK(BM_ReplicaPredict)->Arg(1)->Arg(64)->Arg(512);

}  // namespace
}  // namespace tessera
