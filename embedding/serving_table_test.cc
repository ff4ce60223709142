#include "embedding/serving_table.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "embedding/embedding_table.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/table_configs.h"

namespace tessera::embedding {
namespace {

using ::testing::HasSubstr;

constexpr ServingFormat kFormats[] = {ServingFormat::kFp32, ServingFormat::kFp16,
                                      ServingFormat::kInt8};

std::vector<float> RandomRow(std::mt19937_64& rng, int dim, float scale) {
  std::normal_distribution<float> g(0.0f, scale);
  std::vector<float> row(dim);
  for (float& x : row) x = g(rng);
  return row;
}

std::vector<float> RoundTrip(ServingFormat format, const std::vector<float>& row) {
  const int dim = static_cast<int>(row.size());
  std::vector<uint8_t> bytes(ServingRowBytes(format, dim));
  EncodeServingRow(format, row.data(), dim, bytes.data());
  std::vector<float> back(dim);
  DecodeServingRow(format, bytes.data(), dim, back.data());
  return back;
}

TEST(ServingRows, KeepEachElementWithinTheFormatsBound) {
  std::mt19937_64 rng(3);
  for (const ServingFormat format : kFormats) {
    SCOPED_TRACE(ServingFormatName(format));
    for (const float scale : {1e-6f, 0.05f, 1.0f, 3000.0f}) {
      for (const int dim : {1, 4, 64, 129}) {
        const std::vector<float> row = RandomRow(rng, dim, scale);
        const std::vector<float> back = RoundTrip(format, row);
        const float bound = ServingRowErrorBound(format, row.data(), dim);
        for (int j = 0; j < dim; ++j) {
          EXPECT_LE(std::fabs(back[j] - row[j]), bound) << "scale " << scale << " dim " << dim;
        }
      }
    }
  }
}

TEST(ServingRows, BoundsAreTheFormatsPrecision) {
  std::mt19937_64 rng(5);
  const std::vector<float> row = RandomRow(rng, 64, 0.05f);
  float lo = row[0], hi = row[0];
  for (float x : row) lo = std::min(lo, x), hi = std::max(hi, x);
  EXPECT_EQ(ServingRowErrorBound(ServingFormat::kFp32, row.data(), 64), 0.0f);
  EXPECT_EQ(RoundTrip(ServingFormat::kFp32, row), row);  // bit for bit
  // int8: half of one of 255 steps over the row's range (and float rounding).
  EXPECT_LT(ServingRowErrorBound(ServingFormat::kInt8, row.data(), 64), (hi - lo) / 500.0f);
  // fp16: 11 significant bits of the largest magnitude.
  EXPECT_LT(ServingRowErrorBound(ServingFormat::kFp16, row.data(), 64),
            std::max(std::fabs(lo), std::fabs(hi)) / 1024.0f);
}

TEST(ServingRows, Int8KeepsTheRowsEndsAndAConstantRowExactly) {
  const std::vector<float> row = {-0.5f, 0.25f, 1.5f, 0.0f};
  const std::vector<float> back = RoundTrip(ServingFormat::kInt8, row);
  EXPECT_EQ(back[0], -0.5f);  // the bias
  EXPECT_NEAR(back[2], 1.5f, 1e-6f);
  EXPECT_EQ(ServingRowBytes(ServingFormat::kInt8, 64), 72u);  // 64 levels, scale, bias
  const std::vector<float> constant(16, 0.125f);
  EXPECT_EQ(RoundTrip(ServingFormat::kInt8, constant), constant);
}

TEST(ServingRows, Fp16SaturatesBeyondItsRange) {
  const std::vector<float> row = {1e6f, -1e6f, 1.0f};
  const std::vector<float> back = RoundTrip(ServingFormat::kFp16, row);
  EXPECT_EQ(back[0], 65504.0f);
  EXPECT_EQ(back[1], -65504.0f);
  EXPECT_EQ(back[2], 1.0f);
}

TEST(ServingFormat, ParsesItsNames) {
  for (const ServingFormat format : kFormats) {
    EXPECT_EQ(ParseServingFormat(ServingFormatName(format)).value(), format);
  }
  EXPECT_THAT(std::string(ParseServingFormat("int4").status().message()),
              HasSubstr("unknown serving format 'int4': fp32, fp16 or int8"));
}

std::unique_ptr<ServingTable> Make(const v1::TableConfig& config, ServingFormat format) {
  auto table = ServingTable::Create(config, format);
  EXPECT_TRUE(table.ok()) << table.status();
  return std::move(table).value();
}

// Rows sent are read back (fp32: bit for bit); ids never sent read their initial weights,
// exactly as a read-only lookup of the training table answers them.
TEST(ServingTable, ReadsWhatItWasSentAndTheTrainingTablesInitialRowsElse) {
  const v1::TableConfig config = testing::TestTable("t", 8, 17, v1::ADAGRAD, 0.05f);
  auto serving = Make(config, ServingFormat::kFp32);
  auto training = std::move(EmbeddingTable::Create(config)).value();
  std::mt19937_64 rng(9);
  const std::vector<int64_t> sent = {5, -3, 1ll << 40};
  std::vector<float> rows;
  for (size_t i = 0; i < sent.size(); ++i) {
    const std::vector<float> r = RandomRow(rng, 8, 0.1f);
    rows.insert(rows.end(), r.begin(), r.end());
  }
  ASSERT_TRUE(serving->Apply(sent, rows).ok());
  std::vector<float> got(sent.size() * 8);
  ASSERT_TRUE(serving->Lookup(sent, absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, rows);
  const std::vector<int64_t> unsent = {6, 7, -1};
  std::vector<float> initial(unsent.size() * 8), want(unsent.size() * 8);
  ASSERT_TRUE(serving->Lookup(unsent, absl::MakeSpan(initial)).ok());
  ASSERT_TRUE(training->Lookup(unsent, want.data(), /*insert_missing=*/false).ok());
  EXPECT_EQ(initial, want);
  EXPECT_EQ(serving->rows(), 3);
}

TEST(ServingTable, AnIdSentAgainTakesItsNewRowAndTheLastOfABatch) {
  auto serving = Make(testing::TestTable("t", 2, 1, v1::SGD, 0.1f), ServingFormat::kFp32);
  ASSERT_TRUE(serving->Apply({{4}}, {{1.0f, 2.0f}}).ok());
  ASSERT_TRUE(serving->Apply({{4, 4}}, {{3.0f, 4.0f, 5.0f, 6.0f}}).ok());
  std::vector<float> got(2);
  ASSERT_TRUE(serving->Lookup({{4}}, absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, (std::vector<float>{5.0f, 6.0f}));
  EXPECT_EQ(serving->rows(), 1);
}

TEST(ServingTable, ResetRowsReadTheirInitialWeightsAgainAndIdsListsWhatWasSent) {
  const v1::TableConfig config = testing::TestTable("t", 4, 3, v1::SGD, 0.1f);
  auto serving = Make(config, ServingFormat::kFp32);
  std::vector<float> initial(2 * 4);
  ASSERT_TRUE(serving->Lookup({{8, 9}}, absl::MakeSpan(initial)).ok());
  ASSERT_TRUE(serving->Apply({{8, 9, 10}}, std::vector<float>(12, 0.5f)).ok());
  std::vector<int64_t> ids = serving->Ids();
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<int64_t>{8, 9, 10}));
  ASSERT_TRUE(serving->ResetRows({{8, 9, 77}}).ok());  // 77 was never sent: nothing to do
  std::vector<float> got(3 * 4);
  ASSERT_TRUE(serving->Lookup({{8, 9, 10}}, absl::MakeSpan(got)).ok());
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 8), initial);
  EXPECT_EQ(std::vector<float>(got.begin() + 8, got.end()), std::vector<float>(4, 0.5f));
}

TEST(ServingTable, RefusesBadRowsAndIdsAndKeepsWhatItHad) {
  v1::TableConfig config = testing::TestTable("fixed", 2, 1, v1::SGD, 0.1f);
  config.set_vocabulary_size(100);
  auto serving = Make(config, ServingFormat::kInt8);
  ASSERT_TRUE(serving->Apply({{1}}, {{1.0f, 2.0f}}).ok());
  std::vector<float> before(2), after(2);
  ASSERT_TRUE(serving->Lookup({{1}}, absl::MakeSpan(before)).ok());
  const absl::Status short_rows = serving->Apply({{1, 2}}, {{1.0f, 2.0f}});
  EXPECT_EQ(short_rows.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(short_rows.message()), HasSubstr("2 weights for 2 ids of dim 2"));
  const absl::Status nan = serving->Apply({{1, 2}}, {{0.0f, 0.0f, 1.0f, NAN}});
  EXPECT_EQ(nan.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(nan.message()), HasSubstr("row of id 2 holds nan"));
  const absl::Status outside = serving->Apply({{100}}, {{1.0f, 2.0f}});
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(outside.message()), HasSubstr("serving table 'fixed'"));
  EXPECT_EQ(serving->Lookup({{-1}}, absl::MakeSpan(after)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(serving->Lookup({{1}}, absl::MakeSpan(after.data(), 1)).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(serving->Lookup({{1}}, absl::MakeSpan(after)).ok());
  EXPECT_EQ(after, before);
  EXPECT_EQ(serving->rows(), 1);
  EXPECT_EQ(ServingTable::Create(testing::TestTable("t", 0, 1, v1::SGD, 0.1f), ServingFormat::kFp32)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// Many rows (several blocks, the index grown many times), each read back as sent, and
// what a row costs: at dim 64 in int8 no more than 1.25 x (64 + 8) + 16 bytes.
TEST(ServingTable, HoldsManyRowsWithinTheirMemoryBudget) {
  for (const ServingFormat format : kFormats) {
    SCOPED_TRACE(ServingFormatName(format));
    auto serving = Make(testing::TestTable("t", 64, 1, v1::SGD, 0.1f), format);
    constexpr int kRows = 300000, kBatch = 1000;
    std::vector<int64_t> ids(kBatch);
    std::vector<float> rows(kBatch * 64);
    for (int b = 0; b < kRows; b += kBatch) {
      for (int i = 0; i < kBatch; ++i) {
        ids[i] = (static_cast<int64_t>(b + i) * 7919) ^ 0x5a5a;
        for (int j = 0; j < 64; ++j) rows[i * 64 + j] = static_cast<float>((b + i) % 97 + j);
      }
      ASSERT_TRUE(serving->Apply(ids, rows).ok());
    }
    ASSERT_EQ(serving->rows(), kRows);
    const std::vector<int64_t> probe = {0 ^ 0x5a5a, (123456ll * 7919) ^ 0x5a5a,
                                        ((kRows - 1ll) * 7919) ^ 0x5a5a};
    const std::vector<int64_t> index = {0, 123456, kRows - 1};
    std::vector<float> got(probe.size() * 64);
    ASSERT_TRUE(serving->Lookup(probe, absl::MakeSpan(got)).ok());
    for (size_t p = 0; p < probe.size(); ++p) {
      for (int j = 0; j < 64; ++j) {
        const float want = static_cast<float>(index[p] % 97 + j);
        EXPECT_NEAR(got[p * 64 + j], want, 64.0f / 510.0f + 1e-4f) << index[p];
      }
    }
    const double per_row = static_cast<double>(serving->memory_bytes()) / kRows;
    const double payload = static_cast<double>(ServingRowBytes(format, 64));
    std::printf("%s dim 64: %.1f bytes a row (payload %.0f)\n", ServingFormatName(format).c_str(),
                per_row, payload);
    EXPECT_LE(per_row, 1.25 * payload + 16);
  }
}

// Lookups beside Apply read each row whole: all of one version or all of the next.
TEST(ServingTable, LookupsBesideApplyReadWholeRows) {
  auto serving = Make(testing::TestTable("t", 16, 1, v1::SGD, 0.1f), ServingFormat::kFp32);
  std::vector<int64_t> ids(256);
  for (int i = 0; i < 256; ++i) ids[i] = i;
  ASSERT_TRUE(serving->Apply(ids, std::vector<float>(ids.size() * 16, -1.0f)).ok());
  std::thread writer([&] {
    std::vector<float> rows(ids.size() * 16);
    for (int version = 0; version < 200; ++version) {
      std::fill(rows.begin(), rows.end(), static_cast<float>(version));
      ASSERT_TRUE(serving->Apply(ids, rows).ok());
    }
  });
  std::vector<float> got(ids.size() * 16);
  for (int n = 0; n < 200; ++n) {
    ASSERT_TRUE(serving->Lookup(ids, absl::MakeSpan(got)).ok());
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int j = 1; j < 16; ++j) ASSERT_EQ(got[i * 16 + j], got[i * 16]) << "row " << i;
    }
  }
  writer.join();
}

}  // namespace
}  // namespace tessera::embedding
