#include "embedding/sharding.h"

#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tessera::embedding {
namespace {

TEST(Mix64, IsAFixedFunctionAcrossProcesses) {
  // Golden values: a change here re-routes every row of every deployed table.
  EXPECT_EQ(Mix64(0), 0u);
  EXPECT_EQ(Mix64(1), 0x5692161d100b05e5ULL);
  EXPECT_EQ(Mix64(0x123456789abcdefULL), 0xb2c058e4ebb5112cULL);
}

TEST(JumpConsistentHash, MatchesPublishedReferenceBuckets) {
  // Values of the reference algorithm in Lamping & Veach (2014), as other
  // implementations of it publish them.
  EXPECT_EQ(JumpConsistentHash(0, 1), 0);
  EXPECT_EQ(JumpConsistentHash(1, 1), 0);
  EXPECT_EQ(JumpConsistentHash(0, 60000), 0);
  EXPECT_EQ(JumpConsistentHash(1, 2), 0);
  EXPECT_EQ(JumpConsistentHash(0xDEAD10CCULL, 666), 361);
  EXPECT_EQ(JumpConsistentHash(256, 1024), 520);
  EXPECT_EQ(JumpConsistentHash(42, 57), 43);
  EXPECT_EQ(JumpConsistentHash(10863919174838991ULL, 11), 6);
  EXPECT_EQ(JumpConsistentHash(2016238256797177309ULL, 11), 3);
  EXPECT_EQ(JumpConsistentHash(1673758223894951030ULL, 11), 5);
}

// The published loop, step by step: what JumpConsistentHash's answers for one and two
// buckets (taken without the loop) must equal.
int32_t JumpLoop(uint64_t key, int32_t num_buckets) {
  int64_t b = -1, j = 0;
  while (j < num_buckets) {
    b = j;
    key = key * 2862933555777941757ULL + 1;
    j = static_cast<int64_t>(static_cast<double>(b + 1) * (static_cast<double>(1LL << 31) /
                                                           static_cast<double>((key >> 33) + 1)));
  }
  return static_cast<int32_t>(b);
}

TEST(JumpConsistentHash, OneAndTwoBucketsAnswerAsTheLoopDoes) {
  std::mt19937_64 rng(7);
  std::vector<uint64_t> keys(1000000);
  for (auto& k : keys) k = rng();
  // Keys whose first step lands on the edge between the buckets: (key >> 33) of the
  // stepped key at 2^30 - 1, 2^30 and 2^30 + 1 (stepped keys inverted through the
  // multiplier's inverse mod 2^64).
  uint64_t inverse = 2862933555777941757ULL;  // Newton's iteration for the inverse mod 2^64
  for (int i = 0; i < 6; ++i) inverse *= 2 - 2862933555777941757ULL * inverse;
  ASSERT_EQ(inverse * 2862933555777941757ULL, 1u);
  for (uint64_t top : {(1ULL << 30) - 1, 1ULL << 30, (1ULL << 30) + 1, 0ULL, (1ULL << 31) - 1}) {
    for (uint64_t low : {0ULL, 1ULL, (1ULL << 33) - 1}) {
      keys.push_back(((top << 33 | low) - 1) * inverse);
    }
  }
  int ones = 0;
  for (const uint64_t k : keys) {
    ASSERT_EQ(JumpConsistentHash(k, 1), 0) << k;
    ASSERT_EQ(JumpConsistentHash(k, 2), JumpLoop(k, 2)) << k;
    ones += JumpConsistentHash(k, 2);
  }
  EXPECT_NEAR(ones, static_cast<int>(keys.size()) / 2, 5000);  // both buckets in use
  for (const int32_t n : {3, 4, 7, 64}) {
    for (size_t i = 0; i < 1000; ++i)
      ASSERT_EQ(JumpConsistentHash(keys[i], n), JumpLoop(keys[i], n));
  }
}

TEST(ShardOf, MatchesTheGoldenValuesThePythonClientChecksToo) {
  std::ifstream in(TESSERA_SOURCE_DIR "/tests/data/shard_of_golden.txt");
  ASSERT_TRUE(in.is_open());
  std::string line;
  int checked = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    int64_t id = 0;
    uint64_t seed = 0;
    int shards = 0, shard = -1;
    ASSERT_TRUE(fields >> id >> seed >> shards >> shard) << line;
    EXPECT_EQ(ShardOf(id, seed, shards), shard) << line;
    ++checked;
  }
  EXPECT_GT(checked, 300);
}

TEST(ShardOf, StaysInRangeAndSpreadsEvenly) {
  constexpr int kShards = 8;
  constexpr int kIds = 80000;
  std::vector<int> count(kShards, 0);
  for (int64_t id = 0; id < kIds; ++id) {
    const int s = ShardOf(id, 42, kShards);
    ASSERT_GE(s, 0);
    ASSERT_LT(s, kShards);
    ++count[s];
  }
  for (int c : count) EXPECT_NEAR(c, kIds / kShards, kIds / kShards * 0.05);
}

TEST(ShardOf, GrowingFromNToNPlusOneMovesAboutOneInNPlusOne) {
  constexpr int kIds = 200000;
  for (int n : {1, 2, 3, 4, 7, 16}) {
    int moved = 0;
    for (int64_t i = 0; i < kIds; ++i) {
      const int64_t id = static_cast<int64_t>(Mix64(i * 7919 + 1));
      const int before = ShardOf(id, 99, n);
      const int after = ShardOf(id, 99, n + 1);
      if (before != after) {
        ++moved;
        // Consistent hashing only ever moves ids onto the new shard.
        ASSERT_EQ(after, n) << "id " << id << " moved between old shards";
      }
    }
    const double fraction = static_cast<double>(moved) / kIds;
    EXPECT_NEAR(fraction, 1.0 / (n + 1), 0.01) << "n = " << n;
  }
}

TEST(ShardOf, DependsOnTheTableSeed) {
  int differ = 0;
  for (int64_t id = 0; id < 1000; ++id) differ += ShardOf(id, 1, 4) != ShardOf(id, 2, 4);
  EXPECT_GT(differ, 600);
}

}  // namespace
}  // namespace tessera::embedding
