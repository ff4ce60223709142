#include "embedding/dtype.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace tessera::embedding {
namespace {

std::vector<float> RoundTrip(v1::Dtype dtype, const std::vector<float>& in) {
  std::vector<uint16_t> stored(in.size());
  EncodeWeights(dtype, in.data(), static_cast<int>(in.size()), stored.data());
  std::vector<float> out(in.size());
  DecodeWeights(dtype, stored.data(), static_cast<int>(in.size()), out.data());
  return out;
}

TEST(Dtype, NamesRoundTripAndUnknownNamesAreRefused) {
  for (const v1::Dtype d : {v1::FP32, v1::FP16, v1::BF16}) {
    absl::StatusOr<v1::Dtype> parsed = ParseDtypeName(DtypeName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  // As the proto spells them too (issue 25, item 14).
  EXPECT_EQ(ParseDtypeName("BF16").value(), v1::BF16);
  EXPECT_EQ(ParseDtypeName("Fp16").value(), v1::FP16);
  absl::StatusOr<v1::Dtype> bad = ParseDtypeName("int8");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("int8"), std::string::npos);
  EXPECT_EQ(DtypeBytes(v1::FP32), 4);
  EXPECT_EQ(DtypeBytes(v1::BF16), 2);
}

TEST(Dtype, Bf16RoundsToNearestEvenAndKeepsTheTopSixteenBits) {
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even one (1).
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: to 1 + 2^-6.
  const std::vector<float> in = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-9f + 0x1p-8f,
                                 -2.5f, 0.0f};
  const std::vector<float> out = RoundTrip(v1::BF16, in);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 1.0f + 0x1p-6f);
  EXPECT_EQ(out[2], 1.0f + 0x1p-7f);
  EXPECT_EQ(out[3], -2.5f);
  EXPECT_EQ(out[4], 0.0f);
  for (const float f : RoundTrip(v1::BF16, {0.123456f, -7.654321e20f})) {
    EXPECT_EQ(std::bit_cast<uint32_t>(f) & 0xffffu, 0u);
  }
  EXPECT_TRUE(std::isnan(RoundTrip(v1::BF16, {std::nanf("")})[0]));
}

// Every one of the 63488 finite binary16 values widens and narrows back to itself, and
// each midpoint between neighbours rounds to the even one.
TEST(Dtype, Fp16ConversionsAreExactOnEveryValueAndRoundMidpointsToEven) {
  std::vector<uint16_t> all;
  for (uint32_t b = 0; b < 0x10000; ++b) {
    if ((b & 0x7c00u) != 0x7c00u) all.push_back(static_cast<uint16_t>(b));
  }
  std::vector<float> wide(all.size());
  DecodeWeights(v1::FP16, all.data(), static_cast<int>(all.size()), wide.data());
  std::vector<uint16_t> back(all.size());
  EncodeWeights(v1::FP16, wide.data(), static_cast<int>(wide.size()), back.data());
  EXPECT_EQ(back, all);
  for (size_t i = 0; i + 1 < all.size(); ++i) {
    if (all[i] == 0x7bff || all[i] == 0x8000 || all[i + 1] != all[i] + 1) continue;
    const float mid = (wide[i] + wide[i + 1]) / 2;  // exact in fp32
    uint16_t got = 0;
    EncodeWeights(v1::FP16, &mid, 1, &got);
    ASSERT_EQ(got, (all[i] & 1) ? all[i + 1] : all[i]) << i;
  }
}

TEST(Dtype, Fp16RoundsToNearestAndSaturatesOutOfRange) {
  const std::vector<float> out =
      RoundTrip(v1::FP16, {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 1e6f, -1e6f, 65504.0f, 0x1p-24f});
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 1.0f + 0x1p-9f);
  EXPECT_EQ(out[2], 65504.0f);
  EXPECT_EQ(out[3], -65504.0f);
  EXPECT_EQ(out[4], 65504.0f);
  EXPECT_EQ(out[5], 0x1p-24f);  // the smallest subnormal survives
  EXPECT_TRUE(std::isinf(RoundTrip(v1::FP16, {INFINITY})[0]));
  // Whole vectors of eight and a tail: the same answers lane by lane.
  std::vector<float> many;
  for (int i = 0; i < 21; ++i) many.push_back((i % 2 ? -1.0f : 1.0f) * std::ldexp(1.37f, i - 8));
  many[3] = INFINITY;
  many[4] = -1e9f;
  many[5] = std::nanf("");
  const std::vector<float> back = RoundTrip(v1::FP16, many);
  for (size_t i = 0; i < many.size(); ++i) {
    const std::vector<float> one = RoundTrip(v1::FP16, {many[i]});
    if (std::isnan(many[i])) {
      EXPECT_TRUE(std::isnan(back[i]));
    } else {
      EXPECT_EQ(back[i], one[0]) << i;
    }
  }
  EXPECT_TRUE(std::isinf(back[3]));
  EXPECT_EQ(back[4], -65504.0f);
}

// A value a third of the way from one representable neighbour to the next rounds up a
// third of the time, whatever the dtype, and exactly representable values never move.
TEST(Dtype, StochasticRoundingIsUnbiasedAndExactValuesStay) {
  for (const v1::Dtype d : {v1::BF16, v1::FP16}) {
    const float lo = 1.0f;
    const float ulp = d == v1::BF16 ? 0x1p-7f : 0x1p-10f;
    const int n = 60000;
    std::vector<float> in(n, lo + ulp / 3), neg(n, -(lo + ulp / 3)), exact(n, lo + ulp);
    std::vector<uint16_t> stored(n);
    std::vector<float> out(n);
    double sum = 0;
    for (int i = 0; i < n; i += 64) {
      EncodeWeightsStochastic(d, in.data() + i, std::min(64, n - i), 1000 + i, stored.data() + i);
    }
    DecodeWeights(d, stored.data(), n, out.data());
    for (const float f : out) {
      ASSERT_TRUE(f == lo || f == lo + ulp) << f;
      sum += f;
    }
    EXPECT_NEAR((sum / n - lo) / ulp, 1.0 / 3, 0.01) << DtypeName(d);
    // Negative values round symmetrically.
    EncodeWeightsStochastic(d, neg.data(), n, 77, stored.data());
    DecodeWeights(d, stored.data(), n, out.data());
    sum = 0;
    for (const float f : out) sum += f;
    EXPECT_NEAR((-sum / n - lo) / ulp, 1.0 / 3, 0.01) << DtypeName(d);
    EncodeWeightsStochastic(d, exact.data(), n, 5, stored.data());
    DecodeWeights(d, stored.data(), n, out.data());
    for (const float f : out) ASSERT_EQ(f, lo + ulp);
  }
}

TEST(Dtype, StochasticRoundingIsAPureFunctionOfTheSeed) {
  std::vector<float> in(64);
  for (int i = 0; i < 64; ++i) in[i] = 0.01f * static_cast<float>(i) + 1e-5f;
  std::vector<uint16_t> a(64), b(64), c(64);
  EncodeWeightsStochastic(v1::BF16, in.data(), 64, 42, a.data());
  EncodeWeightsStochastic(v1::BF16, in.data(), 64, 42, b.data());
  EncodeWeightsStochastic(v1::BF16, in.data(), 64, 43, c.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

// Vectors of eight and the tail agree lane by lane, across fp16's normal and subnormal
// ranges, zero, Inf and NaN.
TEST(Dtype, Fp16StochasticRoundingGivesTheSameBitsWhateverTheVectorLane) {
  std::vector<float> in;
  for (int i = 0; i < 43; ++i) in.push_back((i % 3 ? 1.0f : -1.0f) * std::ldexp(1.2345f, i - 30));
  in[7] = 0.0f;
  in[8] = INFINITY;
  in[9] = std::nanf("");
  in[10] = 70000.0f;
  std::vector<uint16_t> all(in.size()), one(1);
  EncodeWeightsStochastic(v1::FP16, in.data(), static_cast<int>(in.size()), 3, all.data());
  // Each value alone, with the random bits it got in the batch: the batch is split at a
  // multiple of four, where a fresh 64-bit draw starts.
  for (size_t start = 0; start < in.size(); start += 4) {
    const int n = static_cast<int>(std::min<size_t>(4, in.size() - start));
    std::vector<uint16_t> part(n);
    // The same draws as the batch: seed offset by the draws before `start`.
    EncodeWeightsStochastic(v1::FP16, in.data() + start, n,
                            3 + static_cast<uint64_t>(start / 4) * 0x9e3779b97f4a7c15ULL,
                            part.data());
    for (int k = 0; k < n; ++k) EXPECT_EQ(part[k], all[start + k]) << start + k;
  }
  std::vector<float> out(in.size());
  DecodeWeights(v1::FP16, all.data(), static_cast<int>(in.size()), out.data());
  EXPECT_EQ(out[7], 0.0f);
  EXPECT_TRUE(std::isinf(out[8]));
  EXPECT_TRUE(std::isnan(out[9]));
  EXPECT_EQ(out[10], 65504.0f);
}

TEST(Dtype, Fp16StochasticRoundingSaturatesInsteadOfOverflowing) {
  const std::vector<float> in(256, 65530.0f);
  std::vector<uint16_t> stored(256);
  std::vector<float> out(256);
  EncodeWeightsStochastic(v1::FP16, in.data(), 256, 9, stored.data());
  DecodeWeights(v1::FP16, stored.data(), 256, out.data());
  for (const float f : out) EXPECT_EQ(f, 65504.0f);
}

}  // namespace
}  // namespace tessera::embedding
