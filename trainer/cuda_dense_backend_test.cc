// The CUDA backend against the CPU backend on the same model, seed and batches. Needs a
// GPU: where the backend cannot run (no CUDA in the build, no driver, no device), main
// says why and exits 77, which CTest counts as skipped.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

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

TEST(CudaDenseBackend, CriteoMlpsMatchTheCpuBackend) {
  DlrmConfig c = Model();
  c.bottom_mlp = {512, 256, 64};
  c.top_mlp = {512, 256};
  auto cpu = Cpu(c);
  auto gpu = Gpu(c);
  ASSERT_NE(gpu, nullptr);
  for (int step = 0; step < 5; ++step) {
    const Batch b = MakeBatch(c, 2048, 50 + step);
    const StepResult x = Step(*cpu, b), y = Step(*gpu, b);
    EXPECT_NEAR(y.loss, x.loss, 1e-4 * std::fabs(x.loss)) << "step " << step;
    EXPECT_LT(RelDiff(y.emb_grads, x.emb_grads), 1e-3) << "step " << step;
  }
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
