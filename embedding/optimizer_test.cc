#include "embedding/optimizer.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace tessera::embedding {
namespace {

constexpr int kDim = 3;

std::unique_ptr<Optimizer> Make(const v1::OptimizerConfig& c) {
  auto opt = Optimizer::Create(c, kDim);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return std::move(opt).value();
}

// Runs the optimizer over a row for each gradient in `grads` and returns the weights.
struct Row {
  std::vector<float> w;
  std::vector<float> state;
};

Row RunSteps(const Optimizer& opt, std::vector<float> w,
             const std::vector<std::vector<float>>& grads) {
  Row r{std::move(w), std::vector<float>(opt.StateFloats())};
  opt.InitState(r.state.data());
  int64_t t = 0;
  for (std::vector<float> g : grads) opt.Update(r.w.data(), r.state.data(), g.data(), t++);
  return r;
}

const std::vector<std::vector<float>> kGrads = {
    {0.5f, -1.0f, 2.0f}, {0.1f, 0.3f, -0.4f}, {-0.7f, 0.0f, 1.1f}};
const std::vector<float> kW0 = {0.2f, -0.1f, 0.05f};

TEST(Sgd, SubtractsLearningRateTimesGradient) {
  v1::OptimizerConfig c;
  c.set_type(v1::SGD);
  c.set_learning_rate(0.1f);
  Row r = RunSteps(*Make(c), kW0, kGrads);
  for (int i = 0; i < kDim; ++i) {
    double w = kW0[i];
    for (const auto& g : kGrads) w -= 0.1 * g[i];
    EXPECT_NEAR(r.w[i], w, 1e-6);
  }
  EXPECT_EQ(Make(c)->StateFloats(), 0);
}

TEST(Adagrad, DividesByRootOfPerCoordinateAccumulator) {
  v1::OptimizerConfig c;
  c.set_type(v1::ADAGRAD);
  c.set_learning_rate(0.5f);
  c.set_initial_accumulator(0.1f);
  c.set_epsilon(1e-6f);
  Row r = RunSteps(*Make(c), kW0, kGrads);
  for (int i = 0; i < kDim; ++i) {
    double w = kW0[i], acc = 0.1;
    for (const auto& g : kGrads) {
      acc += g[i] * g[i];
      w -= 0.5 * g[i] / (std::sqrt(acc) + 1e-6);
    }
    EXPECT_NEAR(r.w[i], w, 1e-5) << i;
    EXPECT_NEAR(r.state[i], acc, 1e-5) << i;
  }
}

TEST(RowWiseAdagrad, AccumulatesMeanSquaredGradientPerRow) {
  v1::OptimizerConfig c;
  c.set_type(v1::ROWWISE_ADAGRAD);
  c.set_learning_rate(0.3f);
  c.set_epsilon(1e-8f);
  auto opt = Make(c);
  EXPECT_EQ(opt->StateFloats(), 1);
  Row r = RunSteps(*opt, kW0, kGrads);
  double acc = 0;
  std::vector<double> w(kW0.begin(), kW0.end());
  for (const auto& g : kGrads) {
    acc += (g[0] * g[0] + g[1] * g[1] + g[2] * g[2]) / 3.0;
    for (int i = 0; i < kDim; ++i) w[i] -= 0.3 * g[i] / (std::sqrt(acc) + 1e-8);
  }
  EXPECT_NEAR(r.state[0], acc, 1e-6);
  for (int i = 0; i < kDim; ++i) EXPECT_NEAR(r.w[i], w[i], 1e-5) << i;
}

TEST(Adam, IsBiasCorrectedWithPerRowStepCount) {
  v1::OptimizerConfig c;
  c.set_type(v1::ADAM);
  c.set_learning_rate(0.01f);
  c.set_beta1(0.8f);
  c.set_beta2(0.95f);
  c.set_epsilon(1e-7f);
  Row r = RunSteps(*Make(c), kW0, kGrads);
  for (int i = 0; i < kDim; ++i) {
    double w = kW0[i], m = 0, v = 0;
    int t = 0;
    for (const auto& g : kGrads) {
      ++t;
      m = 0.8 * m + 0.2 * g[i];
      v = 0.95 * v + 0.05 * g[i] * g[i];
      const double mh = m / (1 - std::pow(0.8, t));
      const double vh = v / (1 - std::pow(0.95, t));
      w -= 0.01 * mh / (std::sqrt(vh) + 1e-7);
    }
    EXPECT_NEAR(r.w[i], w, 1e-6) << i;
  }
  // First step of bias-corrected Adam moves each weight by lr * sign(g) (eps aside).
  Row one = RunSteps(*Make(c), kW0, {kGrads[0]});
  EXPECT_NEAR(one.w[0], kW0[0] - 0.01, 1e-6);
  EXPECT_NEAR(one.w[1], kW0[1] + 0.01, 1e-6);
}

TEST(Ftrl, MatchesProximalClosedFormWithL1Sparsity) {
  v1::OptimizerConfig c;
  c.set_type(v1::FTRL);
  c.set_learning_rate(0.2f);
  c.set_l1(0.3f);
  c.set_l2(0.1f);
  c.set_learning_rate_power(-0.5f);
  Row r = RunSteps(*Make(c), kW0, kGrads);
  for (int i = 0; i < kDim; ++i) {
    double w = kW0[i], z = 0, n = 0;
    for (const auto& g : kGrads) {
      const double n2 = n + g[i] * g[i];
      const double sigma = (std::sqrt(n2) - std::sqrt(n)) / 0.2;
      z += g[i] - sigma * w;
      n = n2;
      w = std::fabs(z) <= 0.3 ? 0.0 : ((z > 0 ? 0.3 : -0.3) - z) / (std::sqrt(n) / 0.2 + 0.2);
    }
    EXPECT_NEAR(r.w[i], w, 1e-5) << i;
  }
  // Coordinate 1 has |z| under l1 after these steps: FTRL's l1 makes it exactly 0.
  EXPECT_EQ(r.w[1], 0.0f);
}

TEST(Ftrl, GeneralLearningRatePowerUsesPowNotSqrt) {
  v1::OptimizerConfig c;
  c.set_type(v1::FTRL);
  c.set_learning_rate(0.5f);
  c.set_learning_rate_power(-0.25f);
  Row r = RunSteps(*Make(c), {0.0f, 0.0f, 0.0f}, {{1.0f, 2.0f, -3.0f}});
  for (int i = 0; i < kDim; ++i) {
    const double g = std::vector<double>{1, 2, -3}[i];
    const double n = g * g;
    const double z = g;  // sigma * w is 0 for w = 0
    EXPECT_NEAR(r.w[i], -z / (std::pow(n, 0.25) / 0.5), 1e-5) << i;
  }
}

TEST(Optimizer, ClipsByValueThenByNormBeforeTheStep) {
  v1::OptimizerConfig c;
  c.set_type(v1::SGD);
  c.set_learning_rate(1.0f);
  c.set_clip_value(1.5f);
  c.set_clip_norm(1.0f);
  Row r = RunSteps(*Make(c), {0.0f, 0.0f, 0.0f}, {{3.0f, 0.0f, -4.0f}});
  // Clipped by value to (1.5, 0, -1.5), norm 2.1213, scaled to norm 1.
  const double s = 1.0 / std::sqrt(1.5 * 1.5 * 2);
  EXPECT_NEAR(r.w[0], -1.5 * s, 1e-6);
  EXPECT_NEAR(r.w[1], 0.0, 1e-6);
  EXPECT_NEAR(r.w[2], 1.5 * s, 1e-6);
}

TEST(Optimizer, WeightDecayAddsDecayTimesWeightToGradient) {
  v1::OptimizerConfig c;
  c.set_type(v1::SGD);
  c.set_learning_rate(0.1f);
  c.set_weight_decay(0.5f);
  Row r = RunSteps(*Make(c), {1.0f, -2.0f, 0.0f}, {{0.0f, 0.0f, 1.0f}});
  EXPECT_NEAR(r.w[0], 1.0 - 0.1 * 0.5 * 1.0, 1e-6);
  EXPECT_NEAR(r.w[1], -2.0 + 0.1 * 0.5 * 2.0, 1e-6);
  EXPECT_NEAR(r.w[2], -0.1, 1e-6);
}

TEST(Optimizer, AKeptGradientStepsLikeTheInPlaceOneAndStaysAsItWas) {
  for (const bool preprocess : {false, true}) {
    v1::OptimizerConfig c;
    c.set_type(v1::ADAGRAD);
    c.set_learning_rate(0.1f);
    if (preprocess) {
      c.set_clip_value(0.5f);
      c.set_weight_decay(0.25f);
    }
    auto opt = Make(c);
    std::vector<float> w1 = {1.0f, -2.0f, 0.5f}, w2 = w1;
    std::vector<float> s1(opt->StateFloats()), s2(opt->StateFloats());
    opt->InitState(s1.data());
    opt->InitState(s2.data());
    const std::vector<float> grad = {0.75f, -0.25f, 2.0f};
    std::vector<float> in_place = grad, scratch(kDim, -9.0f);
    opt->Update(w1.data(), s1.data(), in_place.data(), 0);
    ASSERT_TRUE(opt->UpdateFinite(w2.data(), s2.data(), grad.data(), scratch.data(), 0));
    EXPECT_EQ(w1, w2) << preprocess;
    EXPECT_EQ(s1, s2) << preprocess;
    // Clipping and decay work on the scratch copy, never on the caller's gradient.
    EXPECT_EQ(grad, (std::vector<float>{0.75f, -0.25f, 2.0f}));
    EXPECT_EQ(scratch[0] != -9.0f, preprocess);
  }
}

// UpdateFinite is Update, bit for bit, when every new value is finite (each optimizer, at
// dims computed in registers and at others, with and without clipping), and changes
// nothing when one would not be.
TEST(Optimizer, UpdateFiniteStepsAsUpdateOrLeavesTheRowAsItWas) {
  for (const v1::OptimizerType type :
       {v1::SGD, v1::ADAGRAD, v1::ROWWISE_ADAGRAD, v1::ADAM, v1::FTRL}) {
    for (const int dim : {3, 8, 16, 24, 64, 128}) {
      for (const bool preprocess : {false, true}) {
        SCOPED_TRACE(::testing::Message() << v1::OptimizerType_Name(type) << " dim " << dim
                                          << (preprocess ? " clipped" : ""));
        v1::OptimizerConfig c;
        c.set_type(type);
        c.set_learning_rate(0.05f);
        if (preprocess) c.set_clip_norm(1.0f);
        auto opt = Optimizer::Create(c, dim).value();
        std::vector<float> w1(dim), w2, s1(opt->StateFloats()), s2, scratch(dim);
        opt->InitState(s1.data());
        for (int i = 0; i < dim; ++i) w1[i] = 0.01f * static_cast<float>(i % 7) - 0.03f;
        w2 = w1;
        s2 = s1;
        for (int64_t t = 0; t < 4; ++t) {
          std::vector<float> g(dim);
          for (int i = 0; i < dim; ++i) g[i] = std::sin(static_cast<float>(i + 3 * t)) * 0.4f;
          const std::vector<float> kept = g;
          opt->Update(w1.data(), s1.data(), g.data(), t);
          ASSERT_TRUE(opt->UpdateFinite(w2.data(), s2.data(), kept.data(), scratch.data(), t));
          ASSERT_EQ(w1, w2) << "step " << t;
          ASSERT_EQ(s1, s2) << "step " << t;
        }
        // A gradient that is NaN in its last element: nothing of the row changes.
        std::vector<float> bad(dim, 0.1f);
        bad[dim - 1] = std::numeric_limits<float>::quiet_NaN();
        EXPECT_FALSE(opt->UpdateFinite(w2.data(), s2.data(), bad.data(), scratch.data(), 4));
        EXPECT_EQ(w2, w1);
        EXPECT_EQ(s2, s1);
      }
    }
  }
}

TEST(Optimizer, RejectsBadHyperParameters) {
  v1::OptimizerConfig c;
  c.set_learning_rate(-1.0f);
  auto s = Optimizer::Create(c, 4).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("learning_rate"), std::string::npos) << s;

  v1::OptimizerConfig b;
  b.set_type(v1::ADAM);
  b.set_beta1(1.0f);
  EXPECT_EQ(Optimizer::Create(b, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Optimizer::Create(v1::OptimizerConfig(), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Optimizer, NamesRoundTrip) {
  for (auto t : {v1::SGD, v1::ADAGRAD, v1::ROWWISE_ADAGRAD, v1::ADAM, v1::FTRL}) {
    auto parsed = ParseOptimizerName(OptimizerName(t));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_FALSE(ParseOptimizerName("lamb").ok());
}

}  // namespace
}  // namespace tessera::embedding
