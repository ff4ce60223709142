#include "trainer/dense_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tessera::trainer {
namespace {

DlrmConfig Small() {
  DlrmConfig c;
  c.num_dense = 3;
  c.num_sparse = 3;
  c.emb_dim = 4;
  c.bottom_mlp = {5};
  c.top_mlp = {6};
  c.seed = 11;
  return c;
}

struct Inputs {
  int batch = 5;
  std::vector<float> dense, emb, labels;
};

Inputs MakeInputs(const DlrmConfig& c) {
  Inputs in;
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1, 1);
  in.dense.resize(in.batch * c.num_dense);
  in.emb.resize(c.num_sparse * in.batch * c.emb_dim);
  for (auto& v : in.dense) v = u(rng) + 1.0f;
  for (auto& v : in.emb) v = u(rng);
  for (int b = 0; b < in.batch; ++b) in.labels.push_back(b % 2 ? 1.0f : 0.0f);
  return in;
}

double Loss(DenseBackend& m, const Inputs& in, const std::vector<float>& emb) {
  std::vector<float> logits(in.batch);
  EXPECT_TRUE(m.Forward(in.batch, in.dense.data(), emb.data(), logits.data()).ok());
  double loss = 0;
  for (int b = 0; b < in.batch; ++b) {
    const double p = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[b])));
    loss -= in.labels[b] > 0.5f ? std::log(p) : std::log(1 - p);
  }
  return loss / in.batch;
}

void ExpectClose(double analytic, double numeric, const std::string& what) {
  EXPECT_NEAR(analytic, numeric, 2e-3 + 3e-2 * std::fabs(numeric)) << what;
}

// The one definition of the network's shapes, which the benchmark harness reads too: the
// default model is 13 -> 64 -> 32 -> 16, then 16 + 27 * 26 / 2 = 367 -> 64 -> 32 -> 1.
TEST(DlrmLayerShapes, BottomThenTopWithTheInteractionsWidth) {
  DlrmConfig config;
  size_t bottom = 0;
  const std::vector<DlrmLayerShape> layers = DlrmLayerShapes(config, &bottom);
  ASSERT_EQ(layers.size(), 6u);
  EXPECT_EQ(bottom, 3u);
  const std::vector<std::pair<int, int>> want = {{13, 64},  {64, 32}, {32, 16},
                                                 {367, 64}, {64, 32}, {32, 1}};
  for (size_t i = 0; i < layers.size(); ++i) {
    EXPECT_EQ(std::make_pair(layers[i].in, layers[i].out), want[i]) << "layer " << i;
    EXPECT_EQ(layers[i].relu, i + 1 < layers.size()) << "layer " << i;
  }
}

TEST(CpuDenseBackend, ParameterGradientsMatchFiniteDifferences) {
  auto m = NewCpuDenseBackend(Small());
  ASSERT_TRUE(m.ok()) << m.status();
  Inputs in = MakeInputs(Small());
  std::vector<float> logits(in.batch), emb_grad(in.emb.size());
  ASSERT_TRUE((*m)->Forward(in.batch, in.dense.data(), in.emb.data(), logits.data()).ok());
  auto loss = (*m)->Backward(in.labels.data(), emb_grad.data());
  ASSERT_TRUE(loss.ok());
  EXPECT_NEAR(*loss, Loss(**m, in, in.emb), 1e-5);
  const std::vector<float> grads((*m)->Gradients().begin(), (*m)->Gradients().end());
  absl::Span<float> params = (*m)->Parameters();
  ASSERT_EQ(grads.size(), params.size());
  int checked = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const float saved = params[i];
    const float h = 1e-3f;
    params[i] = saved + h;
    const double up = Loss(**m, in, in.emb);
    params[i] = saved - h;
    const double down = Loss(**m, in, in.emb);
    params[i] = saved;
    ExpectClose(grads[i], (up - down) / (2 * h), "parameter " + std::to_string(i));
    ++checked;
  }
  EXPECT_GT(checked, 100);
}

TEST(CpuDenseBackend, EmbeddingGradientsMatchFiniteDifferences) {
  auto m = NewCpuDenseBackend(Small());
  ASSERT_TRUE(m.ok());
  Inputs in = MakeInputs(Small());
  std::vector<float> logits(in.batch), emb_grad(in.emb.size());
  ASSERT_TRUE((*m)->Forward(in.batch, in.dense.data(), in.emb.data(), logits.data()).ok());
  ASSERT_TRUE((*m)->Backward(in.labels.data(), emb_grad.data()).ok());
  double max_abs = 0;
  for (size_t i = 0; i < in.emb.size(); ++i) {
    std::vector<float> e = in.emb;
    const float h = 1e-3f;
    e[i] += h;
    const double up = Loss(**m, in, e);
    e[i] -= 2 * h;
    const double down = Loss(**m, in, e);
    ExpectClose(emb_grad[i], (up - down) / (2 * h), "embedding input " + std::to_string(i));
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(emb_grad[i])));
  }
  EXPECT_GT(max_abs, 1e-4) << "gradients must reach the embeddings";
}

TEST(CpuDenseBackend, SgdStepMovesParametersAgainstGradient) {
  DlrmConfig c = Small();
  c.optimizer = DenseOptimizerType::kSgd;
  c.learning_rate = 0.5f;
  auto m = NewCpuDenseBackend(c);
  ASSERT_TRUE(m.ok());
  Inputs in = MakeInputs(c);
  std::vector<float> logits(in.batch), emb_grad(in.emb.size());
  const std::vector<float> before((*m)->Parameters().begin(), (*m)->Parameters().end());
  ASSERT_TRUE((*m)->Forward(in.batch, in.dense.data(), in.emb.data(), logits.data()).ok());
  ASSERT_TRUE((*m)->Backward(in.labels.data(), emb_grad.data()).ok());
  const std::vector<float> grads((*m)->Gradients().begin(), (*m)->Gradients().end());
  (*m)->ApplyGradients();
  for (size_t i = 0; i < before.size(); ++i) {
    ASSERT_FLOAT_EQ((*m)->Parameters()[i], before[i] - 0.5f * grads[i]);
  }
}

TEST(CpuDenseBackend, AdamTrainingLowersTheLossOnAFixedBatch) {
  DlrmConfig c = Small();
  c.learning_rate = 1e-2f;
  auto m = NewCpuDenseBackend(c);
  ASSERT_TRUE(m.ok());
  Inputs in = MakeInputs(Small());
  std::vector<float> logits(in.batch), emb_grad(in.emb.size());
  double first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    ASSERT_TRUE((*m)->Forward(in.batch, in.dense.data(), in.emb.data(), logits.data()).ok());
    auto loss = (*m)->Backward(in.labels.data(), emb_grad.data());
    ASSERT_TRUE(loss.ok());
    if (step == 0) first = *loss;
    last = *loss;
    (*m)->ApplyGradients();
  }
  EXPECT_LT(last, first * 0.5);
}

TEST(CpuDenseBackend, RejectsBadUseAndConfigs) {
  auto m = NewCpuDenseBackend(Small());
  ASSERT_TRUE(m.ok());
  std::vector<float> labels(4), grads(100);
  EXPECT_EQ((*m)->Backward(labels.data(), grads.data()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*m)->Forward(0, nullptr, nullptr, nullptr).code(), absl::StatusCode::kInvalidArgument);
  DlrmConfig bad = Small();
  bad.top_mlp = {0};
  EXPECT_EQ(NewCpuDenseBackend(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = Small();
  bad.learning_rate = 0;
  EXPECT_EQ(NewCpuDenseBackend(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuDenseBackend, SameSeedGivesSameParameters) {
  auto a = NewCpuDenseBackend(Small());
  auto b = NewCpuDenseBackend(Small());
  DlrmConfig other = Small();
  other.seed = 12;
  auto c = NewCpuDenseBackend(other);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const std::vector<float> pa((*a)->Parameters().begin(), (*a)->Parameters().end());
  const std::vector<float> pb((*b)->Parameters().begin(), (*b)->Parameters().end());
  const std::vector<float> pc((*c)->Parameters().begin(), (*c)->Parameters().end());
  EXPECT_EQ(pa, pb);
  EXPECT_NE(pa, pc);
}

// One forward, backward and optimizer step; returns the loss.
double Step(DenseBackend& m, const Inputs& in) {
  std::vector<float> logits(in.batch), emb_grad(in.emb.size());
  EXPECT_TRUE(m.Forward(in.batch, in.dense.data(), in.emb.data(), logits.data()).ok());
  auto loss = m.Backward(in.labels.data(), emb_grad.data());
  EXPECT_TRUE(loss.ok());
  m.ApplyGradients();
  return *loss;
}

TEST(CpuDenseBackend, SavedStateContinuesBitForBit) {
  const Inputs in = MakeInputs(Small());
  auto a = NewCpuDenseBackend(Small()).value();
  for (int i = 0; i < 3; ++i) Step(*a, in);
  const std::string state = a->SaveState();
  DlrmConfig other_seed = Small();
  other_seed.seed = 99;  // different initial parameters: all must come from the state
  auto b = NewCpuDenseBackend(other_seed).value();
  ASSERT_TRUE(b->LoadState(state).ok());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(Step(*a, in), Step(*b, in)) << "step " << i;
  const auto pa = a->Parameters();
  const auto pb = b->Parameters();
  EXPECT_TRUE(std::equal(pa.begin(), pa.end(), pb.begin()));
}

TEST(CpuDenseBackend, RejectsStateOfAnotherShapeOrCorrupt) {
  auto a = NewCpuDenseBackend(Small()).value();
  std::string state = a->SaveState();
  DlrmConfig wider = Small();
  wider.top_mlp = {7};
  auto b = NewCpuDenseBackend(wider).value();
  const std::vector<float> before(b->Parameters().begin(), b->Parameters().end());
  EXPECT_EQ(b->LoadState(state).code(), absl::StatusCode::kInvalidArgument);
  state[state.size() / 2] ^= 1;
  EXPECT_EQ(a->LoadState(state).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(a->LoadState("garbage").code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), b->Parameters().begin()));
}

// Counts what a HostFloats allocates through its allocator; `refuse` makes alloc fail.
int allocs = 0, frees = 0;
bool refuse = false;
void* CountingAlloc(size_t bytes) {
  if (refuse) return nullptr;
  ++allocs;
  return std::malloc(bytes);
}
void CountingFree(void* p) {
  ++frees;
  std::free(p);
}

TEST(HostFloats, GrowsKeepingItsContents) {
  allocs = frees = 0;
  refuse = false;
  {
    HostFloats f({CountingAlloc, CountingFree});
    EXPECT_TRUE(f.empty());
    f.resize(3);
    EXPECT_EQ(std::vector<float>(f.begin(), f.end()), std::vector<float>({0, 0, 0}));
    f[0] = 1;
    f[2] = 3;
    f.resize(1000);  // grows: a new block, the old contents copied, the rest zero
    ASSERT_EQ(f.size(), 1000u);
    EXPECT_EQ(f[0], 1);
    EXPECT_EQ(f[2], 3);
    EXPECT_EQ(f[999], 0);
    f.resize(2);  // shrinks in place
    EXPECT_EQ(f.size(), 2u);
    f.resize(3);  // the float past the old size is zero again
    EXPECT_EQ(f[2], 0);
    EXPECT_EQ(allocs, 2);
    EXPECT_EQ(frees, 1);
    HostFloats g = std::move(f);  // moves the block
    EXPECT_TRUE(f.empty());
    EXPECT_EQ(g[0], 1);
    EXPECT_EQ(allocs, 2);
  }
  EXPECT_EQ(frees, 2);  // each block back through its own free
}

TEST(HostFloats, FallsBackToOrdinaryMemory) {
  allocs = frees = 0;
  refuse = true;
  {
    HostFloats f({CountingAlloc, CountingFree});
    f.resize(100);
    f[99] = 5;
    EXPECT_EQ(f[99], 5);
  }
  EXPECT_EQ(frees, 0);  // malloc'd memory goes back to free, not to the allocator's
  refuse = false;
  // A CPU backend hands out ordinary memory.
  HostFloats g = NewCpuDenseBackend(DlrmConfig()).value()->NewHostFloats();
  g.resize(10);
  EXPECT_EQ(g.size(), 10u);
}

}  // namespace
}  // namespace tessera::trainer
