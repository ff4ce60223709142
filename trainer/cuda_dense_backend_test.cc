// The CUDA backend against the CPU backend on the same model, seed and batches. Needs a
// GPU: where the backend cannot run (no CUDA in the build, no driver, no device), main
// says why and exits 77, which CTest counts as skipped.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "trainer/dense_backend.h"

namespace tessera::trainer {
namespace {

DlrmConfig Model(DenseOptimizerType opt = DenseOptimizerType::kAdam) {
  DlrmConfig c;  // tessera-train's default model: 13 dense, 26 sparse, dim 16, 64,32 MLPs
  c.optimizer = opt;
  c.learning_rate = opt == DenseOptimizerType::kAdam ? 2e-3f : 0.05f;
  c.seed = 7;
  return c;
}

struct Batch {
  int size = 0;
  std::vector<float> dense, emb, labels;
};

Batch MakeBatch(const DlrmConfig& c, int size, uint64_t seed) {
  Batch b;
  b.size = size;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  b.dense.resize(static_cast<size_t>(size) * c.num_dense);
  b.emb.resize(static_cast<size_t>(c.num_sparse) * size * c.emb_dim);
  for (auto& v : b.dense) v = std::log1p(std::fabs(u(rng)) * 20.0f);
  for (auto& v : b.emb) v = 0.3f * u(rng);
  // Labels that depend on the inputs, so training has something to learn.
  for (int i = 0; i < size; ++i) {
    const float s = b.dense[static_cast<size_t>(i) * c.num_dense] - 1.5f + 3 * b.emb[i * c.emb_dim];
    b.labels.push_back(s > 0 ? 1.0f : 0.0f);
  }
  return b;
}

std::unique_ptr<DenseBackend> Cpu(const DlrmConfig& c) { return NewCpuDenseBackend(c).value(); }
std::unique_ptr<DenseBackend> Gpu(const DlrmConfig& c) {
  auto m = NewCudaDenseBackend(c);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

// Max |a - b| over max |b|, over whole arrays: small entries are compared on the scale of
// the large ones, as float GEMMs that sum in another order differ.
double RelDiff(absl::Span<const float> a, absl::Span<const float> b) {
  double diff = 0, scale = 1e-12;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

struct StepResult {
  std::vector<float> logits, emb_grads, grads;
  double loss = 0;
};

StepResult Step(DenseBackend& m, const Batch& b, bool apply = true) {
  StepResult r;
  r.logits.resize(b.size);
  r.emb_grads.resize(b.emb.size());
  EXPECT_TRUE(m.Forward(b.size, b.dense.data(), b.emb.data(), r.logits.data()).ok());
  auto loss = m.Backward(b.labels.data(), r.emb_grads.data());
  EXPECT_TRUE(loss.ok()) << loss.status();
  r.loss = loss.ok() ? *loss : NAN;
  r.grads.assign(m.Gradients().begin(), m.Gradients().end());
  if (apply) m.ApplyGradients();
  return r;
}

TEST(CudaDenseBackend, StartsFromTheCpuBackendsWeights) {
  auto cpu = Cpu(Model());
  auto gpu = Gpu(Model());
  ASSERT_NE(gpu, nullptr);
  EXPECT_NE(gpu->name().find("cuda"), std::string::npos) << gpu->name();
  ASSERT_EQ(gpu->Parameters().size(), cpu->Parameters().size());
  for (size_t i = 0; i < cpu->Parameters().size(); ++i) {
    ASSERT_EQ(gpu->Parameters()[i], cpu->Parameters()[i]) << i;
  }
}

TEST(CudaDenseBackend, ForwardAndBackwardMatchTheCpuBackend) {
  for (int batch : {1, 7, 256}) {
    auto cpu = Cpu(Model());
    auto gpu = Gpu(Model());
    ASSERT_NE(gpu, nullptr);
    const Batch b = MakeBatch(Model(), batch, 3);
    const StepResult c = Step(*cpu, b, false), g = Step(*gpu, b, false);
    EXPECT_LT(RelDiff(g.logits, c.logits), 1e-5) << "batch " << batch;
    EXPECT_NEAR(g.loss, c.loss, 1e-5 * std::fabs(c.loss)) << "batch " << batch;
    EXPECT_LT(RelDiff(g.emb_grads, c.emb_grads), 1e-4) << "batch " << batch;
    EXPECT_LT(RelDiff(g.grads, c.grads), 1e-4) << "batch " << batch;
  }
}

// The bar: 100 training steps of the same batches, the loss within 1e-4 relative
// at every step.
void ExpectSameTraining(const DlrmConfig& model, int batch) {
  auto cpu = Cpu(model);
  auto gpu = Gpu(model);
  ASSERT_NE(gpu, nullptr);
  double worst = 0;
  for (int step = 0; step < 100; ++step) {
    const Batch b = MakeBatch(model, batch, 100 + step);
    const StepResult c = Step(*cpu, b), g = Step(*gpu, b);
    worst = std::max(worst, std::fabs(g.loss - c.loss) / std::fabs(c.loss));
  }
  std::printf("100 steps at batch %d: worst relative loss difference %.3g\n", batch, worst);
  EXPECT_LT(worst, 1e-4);
  EXPECT_LT(RelDiff(gpu->Parameters(), cpu->Parameters()), 1e-3);
}

TEST(CudaDenseBackend, HundredAdamStepsMatchTheCpuBackend) {
  ExpectSameTraining(Model(DenseOptimizerType::kAdam), 512);
}

TEST(CudaDenseBackend, HundredSgdStepsMatchTheCpuBackend) {
  ExpectSameTraining(Model(DenseOptimizerType::kSgd), 512);
}

DlrmConfig CriteoModel() {
  DlrmConfig c = Model();
  c.bottom_mlp = {512, 256, 64};
  c.top_mlp = {512, 256};
  return c;
}

// The share of entries of `a` more than `tol` (relative to b's largest) from b's.
double ShareOff(absl::Span<const float> a, absl::Span<const float> b, double tol) {
  double scale = 1e-12;
  for (float v : b) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  size_t off = 0;
  for (size_t i = 0; i < b.size(); ++i)
    off += std::fabs(static_cast<double>(a[i]) - b[i]) > tol * scale;
  return static_cast<double>(off) / std::max<size_t>(b.size(), 1);
}

// The Criteo MLPs at batch 2048: the loss along 5 steps of its own training, and every
// output and gradient from the same parameters at each step (`synced` takes the CPU's
// before each step). Among 2048 samples × 832 ReLUs, a ReLU input can lie within
// rounding of zero; GEMMs that sum in another order then flip it, and that sample's
// embedding gradients change outright. Step 4 here has one: its embedding gradients are
// 1.6e-2 (of the largest) apart on the GPU, and exactly as far apart between two CPU runs
// whose weights start 1e-7 apart. So the embedding gradients must agree within 1e-3 on all
// but 0.1% of their entries (two samples' worth).
TEST(CudaDenseBackend, CriteoMlpsMatchTheCpuBackend) {
  const DlrmConfig c = CriteoModel();
  auto cpu = Cpu(c);
  auto gpu = Gpu(c);
  auto synced = Gpu(c);
  ASSERT_NE(gpu, nullptr);
  ASSERT_NE(synced, nullptr);
  for (int step = 0; step < 5; ++step) {
    const Batch b = MakeBatch(c, 2048, 50 + step);
    const absl::Span<const float> p = cpu->Parameters();
    std::copy(p.begin(), p.end(), synced->Parameters().begin());
    const StepResult x = Step(*cpu, b), y = Step(*gpu, b), z = Step(*synced, b);
    EXPECT_NEAR(y.loss, x.loss, 1e-4 * std::fabs(x.loss)) << "step " << step;
    EXPECT_NEAR(z.loss, x.loss, 1e-5 * std::fabs(x.loss)) << "step " << step;
    EXPECT_LT(RelDiff(z.logits, x.logits), 1e-5) << "step " << step;
    EXPECT_LT(ShareOff(z.emb_grads, x.emb_grads, 1e-3), 1e-3) << "step " << step;
    EXPECT_LT(ShareOff(y.emb_grads, x.emb_grads, 1e-3), 1e-3) << "step " << step;
    EXPECT_LT(RelDiff(z.grads, x.grads), 1e-3) << "step " << step;
  }
}

// The step at the shape, Forward + Backward + ApplyGradients with the embeddings
// and their gradients in NewHostFloats memory, against cuBLAS's GEMMs alone at the same
// shapes; and the same steps from ordinary memory. The figures are printed (they go in
// BENCHMARKS.md); the test checks that the step trains.
TEST(CudaDenseBackend, CriteoStepAgainstTheGemmCeiling) {
  const DlrmConfig c = CriteoModel();
  constexpr int kBatch = 2048, kSteps = 200;
  auto gpu = Gpu(c);
  ASSERT_NE(gpu, nullptr);
  std::printf("backend: %s\n", gpu->name().c_str());
  const Batch b = MakeBatch(c, kBatch, 77);
  HostFloats emb = gpu->NewHostFloats(), emb_grads = gpu->NewHostFloats();
  emb.resize(b.emb.size());
  emb_grads.resize(b.emb.size());
  std::copy(b.emb.begin(), b.emb.end(), emb.begin());
  std::vector<float> plain_grads(b.emb.size()), logits(kBatch);
  for (bool page_locked : {true, false}) {
    double first = 0, last = 0;
    double fwd = 0, bwd = 0, opt = 0;
    auto now = [] { return std::chrono::steady_clock::now(); };
    auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
    const auto start = now();
    for (int step = 0; step < kSteps; ++step) {
      const auto t0 = now();
      ASSERT_TRUE(gpu->Forward(kBatch, b.dense.data(), page_locked ? emb.data() : b.emb.data(),
                               logits.data())
                      .ok());
      const auto t1 = now();
      auto loss =
          gpu->Backward(b.labels.data(), page_locked ? emb_grads.data() : plain_grads.data());
      ASSERT_TRUE(loss.ok()) << loss.status();
      const auto t2 = now();
      gpu->ApplyGradients();
      const auto t3 = now();
      fwd += secs(t0, t1);
      bwd += secs(t1, t2);
      opt += secs(t2, t3);
      if (step == 0) first = *loss;
      last = *loss;
    }
    const double step_s = secs(start, now()) / kSteps;
    auto gemm_s = CudaDlrmGemmSeconds(c, kBatch, 50);
    ASSERT_TRUE(gemm_s.ok()) << gemm_s.status();
    std::printf(
        "Criteo MLPs, batch %d, embeddings from %s memory: step %.3f ms (forward %.3f, "
        "backward %.3f, optimizer %.3f), %.0f samples/s; GEMMs alone %.3f ms; step vs "
        "GEMM ceiling %.2f\n",
        kBatch, page_locked ? "page-locked" : "ordinary", step_s * 1e3, fwd / kSteps * 1e3,
        bwd / kSteps * 1e3, opt / kSteps * 1e3, kBatch / step_s, *gemm_s * 1e3, *gemm_s / step_s);
    // The same batch 200 times: the loss must fall.
    EXPECT_LT(last, first) << "page_locked " << page_locked;
  }
}

// Embeddings and gradients in page-locked memory (copied directly) and in ordinary memory
// (through the staging buffers) give the same bits.
TEST(CudaDenseBackend, PageLockedBuffersGiveTheSameResults) {
  auto staged = Gpu(Model());
  auto direct = Gpu(Model());
  ASSERT_NE(staged, nullptr);
  ASSERT_NE(direct, nullptr);
  HostFloats emb = direct->NewHostFloats(), emb_grads = direct->NewHostFloats();
  for (int step = 0; step < 5; ++step) {
    const Batch b = MakeBatch(Model(), 256, 600 + step);
    emb.resize(b.emb.size());
    emb_grads.resize(b.emb.size());
    std::copy(b.emb.begin(), b.emb.end(), emb.begin());
    std::vector<float> logits_a(b.size), logits_b(b.size), grads_a(b.emb.size());
    ASSERT_TRUE(staged->Forward(b.size, b.dense.data(), b.emb.data(), logits_a.data()).ok());
    ASSERT_TRUE(direct->Forward(b.size, b.dense.data(), emb.data(), logits_b.data()).ok());
    auto loss_a = staged->Backward(b.labels.data(), grads_a.data());
    auto loss_b = direct->Backward(b.labels.data(), emb_grads.data());
    ASSERT_TRUE(loss_a.ok() && loss_b.ok());
    EXPECT_EQ(*loss_a, *loss_b);
    EXPECT_EQ(logits_a, logits_b);
    EXPECT_EQ(grads_a, std::vector<float>(emb_grads.begin(), emb_grads.end()));
    staged->ApplyGradients();
    direct->ApplyGradients();
  }
}

// Graphs (the default) and one launch at a time give the same bits, across batch sizes
// beyond the graph slots and back.
TEST(CudaDenseBackend, GraphsMatchDirectLaunches) {
  auto graphed = Gpu(Model());
  setenv("TESSERA_CUDA_GRAPHS", "0", 1);
  auto direct = Gpu(Model());
  unsetenv("TESSERA_CUDA_GRAPHS");
  ASSERT_NE(graphed, nullptr);
  ASSERT_NE(direct, nullptr);
  EXPECT_EQ(graphed->name().find("graphs off"), std::string::npos) << graphed->name();
  EXPECT_NE(direct->name().find("graphs off"), std::string::npos) << direct->name();
  int step = 0;
  for (int batch : {64, 64, 128, 7, 300, 1, 33, 64, 300, 128}) {
    const Batch b = MakeBatch(Model(), batch, 400 + step++);
    const StepResult x = Step(*direct, b), y = Step(*graphed, b);
    EXPECT_EQ(y.loss, x.loss) << "batch " << batch;
    EXPECT_EQ(y.logits, x.logits) << "batch " << batch;
    EXPECT_EQ(y.emb_grads, x.emb_grads) << "batch " << batch;
    EXPECT_EQ(y.grads, x.grads) << "batch " << batch;
  }
  EXPECT_EQ(graphed->SaveState(), direct->SaveState());
  // Captures that went well leave graphs on.
  EXPECT_EQ(graphed->name().find("graphs off"), std::string::npos) << graphed->name();
}

// A state saved by either backend resumes on the other: both continue with the same
// losses.
TEST(CudaDenseBackend, StateMovesBetweenBackends) {
  for (bool from_gpu : {true, false}) {
    auto a = from_gpu ? Gpu(Model()) : Cpu(Model());
    ASSERT_NE(a, nullptr);
    for (int step = 0; step < 10; ++step) Step(*a, MakeBatch(Model(), 64, step));
    const std::string state = a->SaveState();
    auto b = from_gpu ? Cpu(Model()) : Gpu(Model());
    ASSERT_NE(b, nullptr);
    ASSERT_TRUE(b->LoadState(state).ok());
    EXPECT_EQ(b->SaveState(), state) << "from_gpu " << from_gpu;
    for (int step = 10; step < 15; ++step) {
      const Batch batch = MakeBatch(Model(), 64, step);
      const StepResult x = Step(*a, batch), y = Step(*b, batch);
      EXPECT_NEAR(y.loss, x.loss, 1e-4 * std::fabs(x.loss)) << "from_gpu " << from_gpu;
    }
  }
}

// Writes through Parameters() and MutableGradients() reach the device, as data-parallel
// workers (broadcast, allreduce) rely on.
TEST(CudaDenseBackend, HostWritesReachTheDevice) {
  DlrmConfig c = Model(DenseOptimizerType::kSgd);
  auto cpu = Cpu(c);
  auto gpu = Gpu(c);
  ASSERT_NE(gpu, nullptr);
  for (size_t i = 0; i < cpu->Parameters().size(); i += 3) {
    cpu->Parameters()[i] *= 0.5f;
    gpu->Parameters()[i] *= 0.5f;
  }
  const Batch b = MakeBatch(c, 32, 9);
  StepResult x = Step(*cpu, b, false), y = Step(*gpu, b, false);
  EXPECT_LT(RelDiff(y.logits, x.logits), 1e-5);
  // Zeroed gradients: the SGD step leaves the parameters as they are.
  const std::vector<float> before(gpu->Parameters().begin(), gpu->Parameters().end());
  for (float& g : gpu->MutableGradients()) g = 0.0f;
  gpu->ApplyGradients();
  for (size_t i = 0; i < before.size(); ++i) ASSERT_EQ(gpu->Parameters()[i], before[i]) << i;
  // Doubled gradients: twice the step.
  y = Step(*gpu, b, false);
  for (float& g : gpu->MutableGradients()) g *= 2.0f;
  gpu->ApplyGradients();
  size_t moved = 0;
  for (size_t i = 0; i < before.size(); ++i) {
    const float want = before[i] - 2.0f * c.learning_rate * y.grads[i];
    ASSERT_NEAR(gpu->Parameters()[i], want, 1e-6f + 1e-5f * std::fabs(want)) << i;
    moved += gpu->Parameters()[i] != before[i];
  }
  EXPECT_GT(moved, before.size() / 2);
}

TEST(CudaDenseBackend, BatchSizesChangeBetweenSteps) {
  auto cpu = Cpu(Model());
  auto gpu = Gpu(Model());
  ASSERT_NE(gpu, nullptr);
  int step = 0;
  for (int batch : {16, 300, 5, 300, 64}) {
    const Batch b = MakeBatch(Model(), batch, 200 + step++);
    const StepResult x = Step(*cpu, b), y = Step(*gpu, b);
    EXPECT_NEAR(y.loss, x.loss, 1e-4 * std::fabs(x.loss)) << "batch " << batch;
  }
}

TEST(CudaDenseBackend, RejectsBadUse) {
  auto gpu = Gpu(Model());
  ASSERT_NE(gpu, nullptr);
  std::vector<float> labels(4), grads(4 * 26 * 16);
  EXPECT_EQ(gpu->Backward(labels.data(), grads.data()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(gpu->Forward(0, nullptr, nullptr, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu->LoadState("not a state").code(), absl::StatusCode::kDataLoss);
  DlrmConfig wider = Model();
  wider.top_mlp = {128, 32};
  EXPECT_EQ(gpu->LoadState(Cpu(wider)->SaveState()).code(), absl::StatusCode::kInvalidArgument);
  DlrmConfig bad = Model();
  bad.bottom_mlp = {0};
  EXPECT_EQ(NewCudaDenseBackend(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NewCudaDenseBackend(Model(), 1 << 20).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(CudaDenseBackend, GemmCeilingIsMeasured) {
  DlrmConfig c = Model();
  c.bottom_mlp = {512, 256, 64};
  c.top_mlp = {512, 256};
  auto seconds = CudaDlrmGemmSeconds(c, 2048, 20);
  ASSERT_TRUE(seconds.ok()) << seconds.status();
  EXPECT_GT(*seconds, 0);
  std::printf("Criteo MLPs, batch 2048: GEMMs alone %.3f ms a step (%.0f samples/s)\n",
              *seconds * 1e3, 2048 / *seconds);
}

}  // namespace
}  // namespace tessera::trainer

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (absl::Status usable = tessera::trainer::CudaBackendUsable(); !usable.ok()) {
    std::printf("skipped: the CUDA dense backend cannot run here: %s\n",
                std::string(usable.message()).c_str());
    return 77;
  }
  return RUN_ALL_TESTS();
}
