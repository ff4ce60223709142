#include "embedding/batch_ops.h"

#include <bit>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::embedding {
namespace {

TEST(Unique, KeepsFirstAppearanceOrderAndInverseRebuildsInput) {
  std::vector<int64_t> ids = {7, -1, 7, 3, -1, 1LL << 60, 3, 7};
  std::vector<int64_t> u;
  std::vector<int32_t> inv;
  Unique(ids, &u, &inv);
  EXPECT_EQ(u, (std::vector<int64_t>{7, -1, 3, 1LL << 60}));
  ASSERT_EQ(inv.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(u[inv[i]], ids[i]);
}

TEST(Unique, HandlesLargeRandomBatchesAndReuseAcrossCalls) {
  std::mt19937_64 rng(1);
  for (int round = 0; round < 5; ++round) {
    std::vector<int64_t> ids(5000 + round * 1000);
    for (auto& id : ids) id = static_cast<int64_t>(rng() % 3000);
    std::vector<int64_t> u;
    std::vector<int32_t> inv;
    Unique(ids, &u, &inv);
    EXPECT_EQ(u.size(), std::set<int64_t>(ids.begin(), ids.end()).size());
    EXPECT_EQ(std::set<int64_t>(u.begin(), u.end()).size(), u.size());
    for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(u[inv[i]], ids[i]);
  }
  std::vector<int64_t> u;
  std::vector<int32_t> inv;
  Unique({}, &u, &inv);
  EXPECT_TRUE(u.empty());
  EXPECT_TRUE(inv.empty());
}

TEST(ValidateBags, NamesTheBrokenRule) {
  std::vector<int32_t> good = {0, 2, 2, 5};
  EXPECT_TRUE(ValidateBags(5, good, 0).ok());
  EXPECT_TRUE(ValidateBags(5, good, 5).ok());
  auto msg = [](absl::Status s) { return std::string(s.message()); };
  std::vector<int32_t> not_zero = {1, 5};
  EXPECT_THAT(msg(ValidateBags(5, not_zero, 0)), testing::HasSubstr("start at 0"));
  std::vector<int32_t> down = {0, 3, 2, 5};
  EXPECT_THAT(msg(ValidateBags(5, down, 0)), testing::HasSubstr("not monotone"));
  std::vector<int32_t> past = {0, 2, 6};
  EXPECT_THAT(msg(ValidateBags(5, past, 0)), testing::HasSubstr("out of range"));
  std::vector<int32_t> short_end = {0, 2, 4};
  EXPECT_EQ(ValidateBags(5, short_end, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(msg(ValidateBags(5, good, 3)), testing::HasSubstr("weights has 3"));
  EXPECT_EQ(ValidateBags(0, {}, 0).code(), absl::StatusCode::kInvalidArgument);
}

// rows of the distinct ids: row r = (r + 1, 10 * (r + 1)).
std::vector<float> Rows(int n) {
  std::vector<float> r;
  for (int i = 0; i < n; ++i) {
    r.push_back(i + 1.0f);
    r.push_back(10.0f * (i + 1));
  }
  return r;
}

TEST(PoolBags, SumsAndMeansWithOptionalWeights) {
  const std::vector<float> rows = Rows(3);
  const std::vector<int32_t> inverse = {0, 1, 1, 2};  // ids a, b, b, c
  const std::vector<int32_t> offsets = {0, 3, 3, 4};  // bags {a b b}, {}, {c}
  std::vector<float> out(6);
  PoolBags(rows.data(), 2, inverse, offsets, {}, v1::SUM, out.data());
  EXPECT_EQ(out, (std::vector<float>{5, 50, 0, 0, 3, 30}));
  PoolBags(rows.data(), 2, inverse, offsets, {}, v1::MEAN, out.data());
  EXPECT_THAT(out, testing::Pointwise(testing::FloatEq(),
                                      std::vector<float>{5.0f / 3, 50.0f / 3, 0, 0, 3, 30}));
  const std::vector<float> w = {2.0f, 0.5f, 1.0f, -1.0f};
  PoolBags(rows.data(), 2, inverse, offsets, w, v1::SUM, out.data());
  EXPECT_EQ(out, (std::vector<float>{5, 50, 0, 0, -3, -30}));
  // SQRTN: the sum times 1 / sqrt(count), rounded as float.
  PoolBags(rows.data(), 2, inverse, offsets, {}, v1::SQRTN, out.data());
  const float third = 1.0f / std::sqrt(3.0f);
  EXPECT_EQ(out, (std::vector<float>{5 * third, 50 * third, 0, 0, 3, 30}));
  const std::vector<int32_t> four = {0, 1, 1, 2}, one_bag = {0, 4};
  std::vector<float> two(2);
  PoolBags(rows.data(), 2, four, one_bag, {}, v1::SQRTN, two.data());
  EXPECT_EQ(two, (std::vector<float>{4, 40}));  // (1 + 2 + 2 + 3) / 2
}

TEST(PoolBagsBackward, MatchesFiniteDifferenceOfPooledSum) {
  // d/drow of sum_b <gbag_b, pooled_b> for random data, checked numerically.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  const int dim = 3;
  const std::vector<int32_t> inverse = {0, 2, 1, 0, 2, 2};
  const std::vector<int32_t> offsets = {0, 2, 5, 6};
  std::vector<float> weights(6);
  for (auto& w : weights) w = u(rng);
  std::vector<float> rows(3 * dim), gbag(3 * dim);
  for (auto& v : rows) v = u(rng);
  for (auto& v : gbag) v = u(rng);
  for (v1::Pooling pooling : {v1::SUM, v1::MEAN, v1::SQRTN}) {
    for (bool weighted : {false, true}) {
      absl::Span<const float> wspan =
          weighted ? absl::MakeConstSpan(weights) : absl::Span<const float>();
      std::vector<float> grad(3 * dim);
      PoolBagsBackward(gbag.data(), dim, inverse, offsets, wspan, pooling, 3, grad.data());
      auto objective = [&](const std::vector<float>& r) {
        std::vector<float> out(3 * dim);
        PoolBags(r.data(), dim, inverse, offsets, wspan, pooling, out.data());
        double s = 0;
        for (size_t i = 0; i < out.size(); ++i) s += double(out[i]) * gbag[i];
        return s;
      };
      for (size_t i = 0; i < rows.size(); ++i) {
        std::vector<float> plus = rows, minus = rows;
        plus[i] += 1e-2f;
        minus[i] -= 1e-2f;
        const double fd = (objective(plus) - objective(minus)) / 2e-2;
        EXPECT_NEAR(grad[i], fd, 1e-4) << "pooling " << pooling << " weighted " << weighted;
      }
    }
  }
}

// The sum pooling of the common dimensions takes its own loop: the same bits as a plain
// sum in id order at those dimensions and others (and pooling's backward likewise).
TEST(PoolBags, UnweightedSumsAreTheSameBitsAtEveryDimension) {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const int dim : {4, 8, 16, 24, 32, 64, 128}) {
    const int unique = 13, bags = 9;
    std::vector<float> rows(unique * dim), bag_grads(bags * dim);
    for (float& x : rows) x = u(rng);
    for (float& x : bag_grads) x = u(rng);
    std::vector<int32_t> offsets = {0};
    std::vector<int32_t> inverse;
    for (int b = 0; b < bags; ++b) {
      const int n = b % 4;  // empty bags too
      for (int k = 0; k < n; ++k) inverse.push_back(static_cast<int32_t>(rng() % unique));
      offsets.push_back(static_cast<int32_t>(inverse.size()));
    }
    std::vector<float> want(bags * dim, 0.0f), want_back(unique * dim, 0.0f);
    for (int b = 0; b < bags; ++b) {
      for (int k = offsets[b]; k < offsets[b + 1]; ++k) {
        for (int j = 0; j < dim; ++j) {
          want[b * dim + j] += rows[inverse[k] * dim + j];
          want_back[inverse[k] * dim + j] += bag_grads[b * dim + j];
        }
      }
    }
    std::vector<float> got(bags * dim, -7.0f), got_back(unique * dim, -7.0f);
    PoolBags(rows.data(), dim, inverse, offsets, {}, v1::SUM, got.data());
    PoolBagsBackward(bag_grads.data(), dim, inverse, offsets, {}, v1::SUM, unique,
                     got_back.data());
    EXPECT_EQ(got, want) << "dim " << dim;
    EXPECT_EQ(got_back, want_back) << "dim " << dim;
  }
}

TEST(SumRowsByInverse, AddsRepeatedRows) {
  const std::vector<float> rows = {1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> inverse = {1, 0, 1};
  std::vector<float> out(4, 0.0f);
  SumRowsByInverse(rows.data(), 2, inverse, out.data());
  EXPECT_EQ(out, (std::vector<float>{3, 4, 6, 8}));
}

// Distinct ids take a pass of their own: each sum is its gradient added to 0, bit for bit
// what summing gives (a -0 gradient comes out +0), in batch order, also after a call with
// repeated ids left the same object with more rows.
TEST(SumGradients, DistinctIdsSumAsRepeatedOnesDo) {
  SummedGradients summed;
  const std::vector<int64_t> repeated = {3, 8, 3, 5, 8};
  const std::vector<float> g5 = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  ASSERT_TRUE(SumGradients("t", repeated, g5, 2, &summed).ok());
  EXPECT_EQ(std::vector<float>(summed.rows(), summed.rows() + 6),
            (std::vector<float>{6, 8, 12, 14, 7, 8}));
  const std::vector<int64_t> distinct = {9, 2, 6};
  const std::vector<float> g3 = {-0.0f, 1.5f, -2.0f, -0.0f, 1e-40f, 7.0f};
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(SumGradients("t", distinct, g3, 2, &summed).ok());
    EXPECT_EQ(std::vector<int64_t>(summed.ids().begin(), summed.ids().end()), distinct);
    ASSERT_EQ(summed.size(), 3u);
    for (size_t i = 0; i < g3.size(); ++i) {
      const float expected = 0.0f + g3[i];
      EXPECT_EQ(std::bit_cast<uint32_t>(summed.rows()[i]), std::bit_cast<uint32_t>(expected))
          << "value " << i;
    }
    EXPECT_FALSE(std::signbit(summed.rows()[0]));  // -0 summed is +0
  }
  const std::vector<float> bad = {1, 2, 3, std::nanf(""), 5, 6};
  const absl::Status s = SumGradients("t", distinct, bad, 2, &summed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("id 2"));
}

// The culprit of a bad sum is the gradient sent, when one was bad: not the sum it spoiled.
TEST(SumGradients, NamesTheBadGradientSentNotTheSumOfRepeatedIds) {
  SummedGradients summed;
  const std::vector<int64_t> ids = {7, 9, 7};
  const std::vector<float> g = {1, 2, 3, 4, std::nanf(""), 6};
  const absl::Status s = SumGradients("t", ids, g, 2, &summed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("gradient for id 7 (position 2, column 0) is nan"));
  EXPECT_THAT(std::string(s.message()), ::testing::Not(::testing::HasSubstr("summed over")));
}

// Finite gradients whose sum overflows are refused, checked or not; checked gradients of
// distinct ids are summed as they are.
TEST(SumGradients, ChecksTheSumsOfRepeatedIdsOfACheckedPush) {
  const v1::TableConfig config = [] {
    v1::TableConfig c;
    c.set_name("t");
    c.set_dim(1);
    return c;
  }();
  const std::vector<int64_t> repeated = {4, 4}, distinct = {4, 5};
  const std::vector<float> huge = {3e38f, 3e38f};
  for (const auto& ids : {repeated, distinct}) {
    const TableGradients part{"t", ids, huge};
    absl::StatusOr<CheckedPush> push = CheckPush({&config, 1}, {&part, 1});
    ASSERT_TRUE(push.ok()) << push.status();  // every value is finite
    ASSERT_EQ(push->size(), 1u);
    SummedGradients summed;
    for (Gradients given : {Gradients::kChecked, Gradients::kUnchecked}) {
      const absl::Status s = SumGradients("t", ids, huge, 1, &summed, given);
      if (ids == distinct) {
        EXPECT_TRUE(s.ok()) << s;
        EXPECT_EQ(summed.size(), 2u);
        continue;
      }
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("summed over repeated ids"));
    }
  }
}

TEST(CheckPush, RefusesAWrongSizeOrABadValueAndNamesTheTable) {
  v1::TableConfig config;
  config.set_name("t");
  config.set_dim(2);
  const std::vector<int64_t> ids = {1, 2};
  const std::vector<float> short_rows = {1, 2, 3};
  const std::vector<float> inf_row = {1, 2, 3, INFINITY};
  const TableGradients shorter{"t", ids, short_rows}, bad{"t", ids, inf_row};
  const absl::Status size = CheckPush({&config, 1}, {&shorter, 1}).status();
  EXPECT_EQ(size.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(size.message()), ::testing::HasSubstr("table 't': dimension mismatch"));
  const absl::Status value = CheckPush({&config, 1}, {&bad, 1}).status();
  EXPECT_EQ(value.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(value.message()),
              ::testing::HasSubstr("gradient for id 2 (position 1, column 1) is inf"));
}

// A comma-separated list of numbers of the golden file ("-": none).
template <typename T>
std::vector<T> GoldenList(const std::string& field) {
  std::vector<T> out;
  if (field == "-") return out;
  for (const std::string& v : std::vector<std::string>(absl::StrSplit(field, ','))) {
    out.push_back(static_cast<T>(std::strtod(v.c_str(), nullptr)));  // inf and nan too
  }
  return out;
}

TEST(CheckLookupShape, RefusesAsTheGoldenFileThePythonClientChecksToo) {
  std::ifstream in(TESSERA_SOURCE_DIR "/tests/data/lookup_checks_golden.txt");
  ASSERT_TRUE(in.is_open());
  std::string line;
  int checked = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const std::vector<std::string> f = absl::StrSplit(line, '\t');
    ASSERT_EQ(f.size(), 5u) << line;
    const std::vector<int64_t> ids = GoldenList<int64_t>(f[1]);
    absl::Status s;
    if (f[0] == "lookup") {
      const std::vector<int32_t> offsets = GoldenList<int32_t>(f[2]);
      const std::vector<float> weights = GoldenList<float>(f[3]);
      s = CheckLookupShape("table 'ads'", ids.size(), offsets, weights).status();
    } else {
      ASSERT_EQ(f[0], "gradients") << line;
      const std::vector<float> gradients = GoldenList<float>(f[3]);
      s = CheckFiniteGradients("ads", ids, gradients.data(), std::stoi(f[2]));
    }
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << line << ": " << s;
    EXPECT_EQ(s.message(), "table 'ads': " + f[4]) << line;
    ++checked;
  }
  EXPECT_GE(checked, 8);
}

}  // namespace
}  // namespace tessera::embedding
