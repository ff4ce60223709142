#include "base/zipf_sampler.h"

#include <cmath>
#include <map>
#include <random>

#include "gtest/gtest.h"

namespace tessera::base {
namespace {

TEST(ZipfSampler, FollowsThePowerLawAndStaysInRange) {
  constexpr int64_t kN = 1000;
  constexpr double kS = 1.1;
  ZipfSampler zipf(kN, kS);
  std::mt19937_64 rng(3);
  std::map<int64_t, int> counts;
  constexpr int kDraws = 200000;
  for (int i = 0; i < kDraws; ++i) {
    const int64_t k = zipf(rng);
    ASSERT_GE(k, 1);
    ASSERT_LE(k, kN);
    ++counts[k];
  }
  double h = 0;
  for (int64_t k = 1; k <= kN; ++k) h += std::pow(static_cast<double>(k), -kS);
  for (int64_t k : {1, 2, 10}) {
    const double expected = kDraws * std::pow(static_cast<double>(k), -kS) / h;
    EXPECT_NEAR(counts[k], expected, 5 * std::sqrt(expected)) << "rank " << k;
  }
}

TEST(ZipfSampler, SamplesTablesOfBillionsOfRowsInConstantMemory) {
  ZipfSampler zipf(int64_t{4} << 30, 1.05);
  std::mt19937_64 rng(5);
  int64_t beyond_a_million = 0;
  for (int i = 0; i < 10000; ++i) {
    const int64_t k = zipf(rng);
    ASSERT_GE(k, 1);
    ASSERT_LE(k, int64_t{4} << 30);
    beyond_a_million += k > 1000000;
  }
  // Zipf(1.05) over 4 Gi ranks puts 24.5% of its mass past rank 10^6 (a table that
  // sampled only a cached prefix of its ranks would put none there).
  EXPECT_GT(beyond_a_million, 2200);
  EXPECT_LT(beyond_a_million, 2700);
}

}  // namespace
}  // namespace tessera::base
