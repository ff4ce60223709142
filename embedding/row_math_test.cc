// row_math is the one definition of a row's per-element arithmetic for host and device
// tables. These tests check that the host's row-level code (vectorised loops, F16C
// conversions, the optimizers' classes, the initializer) gives exactly the bits of the
// per-element functions applied one element at a time, as a device kernel applies them.

#include "embedding/row_math.h"

#include <cstring>
#include <random>
#include <vector>

#include "embedding/dtype.h"
#include "embedding/internal/row_initializer.h"
#include "embedding/optimizer.h"
#include "embedding/sharding.h"
#include "gtest/gtest.h"

namespace tessera::embedding {
namespace {

static_assert(Mix64(12345) == row_math::Mix(12345));

std::vector<float> RandomFloats(int n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

// Values of every kind a conversion meets: normal, fp16-subnormal, tiny, huge, zero.
std::vector<float> Awkward() {
  std::vector<float> v = RandomFloats(203, 1, 1.0f);
  for (float x : {0.0f, -0.0f, 1e-6f, -3e-5f, 6.1e-5f, 7e4f, -1e5f, 65504.0f, 1e-40f, 3.4e38f}) {
    v.push_back(x);
  }
  std::vector<float> small = RandomFloats(61, 2, 1e-5f);
  v.insert(v.end(), small.begin(), small.end());
  return v;
}

uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

TEST(RowMath, HostConversionsAreTheElementFunctions) {
  const std::vector<float> in = Awkward();
  const int n = static_cast<int>(in.size());
  std::vector<uint16_t> half(n), bf16(n);
  EncodeWeights(v1::FP16, in.data(), n, half.data());
  EncodeWeights(v1::BF16, in.data(), n, bf16.data());
  std::vector<float> half_back(n), bf16_back(n);
  DecodeWeights(v1::FP16, half.data(), n, half_back.data());
  DecodeWeights(v1::BF16, bf16.data(), n, bf16_back.data());
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(half[i], row_math::HalfNearest(in[i])) << in[i];
    EXPECT_EQ(bf16[i], row_math::Bf16Nearest(in[i])) << in[i];
    EXPECT_EQ(BitsOf(half_back[i]), BitsOf(row_math::HalfToFloat(half[i])));
    EXPECT_EQ(BitsOf(bf16_back[i]), BitsOf(row_math::Bf16ToFloat(bf16[i])));
  }
}

TEST(RowMath, HostStochasticRoundingIsTheElementFunctionsWithTheirBits) {
  const std::vector<float> in = Awkward();
  const int n = static_cast<int>(in.size());
  for (const uint64_t seed : {uint64_t{0}, uint64_t{7}, ~uint64_t{0} / 3}) {
    std::vector<uint16_t> half(n), bf16(n);
    EncodeWeightsStochastic(v1::FP16, in.data(), n, seed, half.data());
    EncodeWeightsStochastic(v1::BF16, in.data(), n, seed, bf16.data());
    for (int i = 0; i < n; ++i) {
      const uint16_t bits = row_math::RoundingBits(seed, i);
      EXPECT_EQ(half[i], row_math::HalfStochastic(in[i], bits)) << i << " " << in[i];
      EXPECT_EQ(bf16[i], row_math::Bf16Stochastic(in[i], bits)) << i << " " << in[i];
    }
  }
  // The bits differ from element to element and seed to seed.
  EXPECT_NE(row_math::RoundingBits(1, 0), row_math::RoundingBits(1, 1));
  EXPECT_NE(row_math::RoundingBits(1, 0), row_math::RoundingBits(2, 0));
}

TEST(RowMath, InitialRowsAreTheElementFunctionsOfSeedIdAndColumn) {
  for (const v1::InitializerType type : {v1::UNIFORM, v1::NORMAL}) {
    for (const int dim : {7, 16}) {
      v1::TableConfig config;
      config.set_dim(dim);
      config.set_seed(99);
      config.mutable_initializer()->set_type(type);
      config.mutable_initializer()->set_scale(0.3f);
      const embedding_internal::RowInitializer init(config);
      EXPECT_EQ(init.key(), row_math::InitKey(99));
      for (const int64_t id : {int64_t{0}, int64_t{5}, int64_t{-3}, int64_t{1} << 50}) {
        std::vector<float> host(dim), element(dim);
        init.InitialWeights(id, host.data());
        const uint64_t base = row_math::InitBase(init.key(), id);
        for (int j = 0; j < dim; ++j) {
          if (type == v1::UNIFORM) {
            element[j] = row_math::UniformInitial(base, j, 0.3f);
          } else if (j % 2 == 0) {
            row_math::NormalInitialPair(base, j, dim, 0.3f, element.data());
          }
        }
        for (int j = 0; j < dim; ++j) EXPECT_EQ(BitsOf(host[j]), BitsOf(element[j])) << j;
      }
    }
  }
}

TEST(RowMath, EveryOptimizersHostUpdateIsTheRowFunctions) {
  constexpr int kDim = 19;  // not a multiple of a vector's width
  for (const v1::OptimizerType type :
       {v1::SGD, v1::ADAGRAD, v1::ROWWISE_ADAGRAD, v1::ADAM, v1::FTRL}) {
    for (const bool preprocess : {false, true}) {
      v1::OptimizerConfig config;
      config.set_type(type);
      config.set_learning_rate(0.05f);
      config.set_l1(0.001f);
      config.set_l2(0.01f);
      config.set_initial_accumulator(0.1f);
      if (preprocess) {
        config.set_clip_value(0.8f);
        config.set_clip_norm(1.5f);
        config.set_weight_decay(0.02f);
      }
      const auto opt = Optimizer::Create(config, kDim).value();
      const row_math::OptimizerKind kind = KindOf(type);
      const row_math::Hyper h = HyperOf(ResolveOptimizer(config).value());
      ASSERT_EQ(row_math::StateFloatsOf(kind, kDim), opt->StateFloats());
      std::vector<float> w = RandomFloats(kDim, 3, 0.2f);
      std::vector<float> state(opt->StateFloats());
      opt->InitState(state.data());
      std::vector<float> w_el = w, state_el(state.size(), -1.0f);
      row_math::InitStateRow(kind, kDim, config.initial_accumulator(), state_el.data());
      ASSERT_EQ(state_el, state);
      for (int step = 0; step < 5; ++step) {
        const std::vector<float> g = RandomFloats(kDim, 10 + step, 0.7f);
        std::vector<float> scratch(kDim);
        ASSERT_TRUE(opt->UpdateFinite(w.data(), state.data(), g.data(), scratch.data(), step));
        std::vector<float> g_el = g;  // the row functions, as a device thread runs them
        row_math::PreprocessRow(h, kDim, w_el.data(), g_el.data());
        row_math::StepRow(kind, h, kDim, w_el.data(), state_el.data(), g_el.data(), step);
        for (int i = 0; i < kDim; ++i) {
          ASSERT_EQ(BitsOf(w[i]), BitsOf(w_el[i]))
              << OptimizerName(type) << " preprocess " << preprocess << " step " << step;
        }
        for (size_t i = 0; i < state.size(); ++i) ASSERT_EQ(BitsOf(state[i]), BitsOf(state_el[i]));
      }
    }
  }
}

}  // namespace
}  // namespace tessera::embedding
