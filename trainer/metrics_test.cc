#include "trainer/metrics.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tessera::trainer {
namespace {

TEST(ExactAuc, CountsCorrectlyOrderedPairs) {
  EXPECT_DOUBLE_EQ(
      ExactAuc(std::vector<float>{0.1f, 0.4f, 0.35f, 0.8f}, std::vector<float>{0, 0, 1, 1}), 0.75);
  EXPECT_DOUBLE_EQ(ExactAuc(std::vector<float>{0.9f, 0.1f}, std::vector<float>{0, 1}), 0.0);
  EXPECT_DOUBLE_EQ(ExactAuc(std::vector<float>{0.1f, 0.9f}, std::vector<float>{0, 1}), 1.0);
}

TEST(ExactAuc, CountsTiesAsHalf) {
  EXPECT_DOUBLE_EQ(ExactAuc(std::vector<float>{0.5f, 0.5f, 0.5f}, std::vector<float>{0, 1, 1}),
                   0.5);
  // Pairs (neg, pos): (0.2, 0.5) right, (0.5, 0.5) tie, (0.2, 0.7) right, (0.5, 0.7) right.
  EXPECT_DOUBLE_EQ(
      ExactAuc(std::vector<float>{0.2f, 0.5f, 0.5f, 0.7f}, std::vector<float>{0, 0, 1, 1}),
      (3 + 0.5) / 4);
  EXPECT_DOUBLE_EQ(ExactAuc(std::vector<float>{0.2f, 0.3f}, std::vector<float>{1, 1}), 0.5);
}

TEST(ExactAuc, MatchesBruteForceOnRandomData) {
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> score(0, 20);  // many ties
  std::vector<float> s(400), y(400);
  for (size_t i = 0; i < s.size(); ++i) {
    s[i] = static_cast<float>(score(rng));
    y[i] = static_cast<float>(rng() % 2);
  }
  double right = 0, pairs = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    for (size_t j = 0; j < s.size(); ++j) {
      if (y[i] == 1 && y[j] == 0) {
        ++pairs;
        right += s[i] > s[j] ? 1.0 : (s[i] == s[j] ? 0.5 : 0.0);
      }
    }
  }
  EXPECT_NEAR(ExactAuc(s, y), right / pairs, 1e-12);
}

TEST(LogLoss, IsMeanBinaryCrossEntropy) {
  EXPECT_NEAR(LogLoss(std::vector<float>{0.8f, 0.3f}, std::vector<float>{1, 0}),
              -(std::log(0.8) + std::log(0.7)) / 2, 1e-6);
  EXPECT_LT(LogLoss(std::vector<float>{0.0f}, std::vector<float>{1}), 17.0);  // clamped
}

}  // namespace
}  // namespace tessera::trainer
