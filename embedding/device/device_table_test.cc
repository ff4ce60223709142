// DeviceTable on a GPU against the host EmbeddingTable: the same seed and batches, 200
// steps of each optimizer and dtype, pooled lookups and the pooling's backward on the
// device. Without a usable GPU (or without CUDA in the build) it says why and exits 77,
// which CTest counts as skipped.

#include "embedding/device/device_table.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "embedding/batch_ops.h"
#include "embedding/device/table_layout.h"
#include "embedding/dtype.h"
#include "embedding/embedding_table.h"
#include "embedding/optimizer.h"
#include "gtest/gtest.h"
#include "tests/support/table_configs.h"

namespace tessera::embedding::device {
namespace {

v1::TableConfig Config(v1::OptimizerType type, v1::Dtype dtype) {
  v1::TableConfig c = testing::TestTable("t", 16, 77, type, 0.05f);
  c.set_dtype(dtype);
  c.set_max_rows(20000);
  if (type == v1::FTRL) c.mutable_optimizer()->set_l1(0.001f);
  return c;
}

// Within 1e-5 relative for fp32 (the device's sqrt and division round as the host's; its
// powf may not), within one unit in the last place of a half type.
bool Close(float device, float host, v1::Dtype dtype) {
  if (dtype == v1::FP32)
    return std::fabs(device - host) <= 1e-5f * std::fmax(1.0f, std::fabs(host));
  uint16_t a, b;
  EncodeWeights(dtype, &device, 1, &a);
  EncodeWeights(dtype, &host, 1, &b);
  return std::abs(static_cast<int>(a) - static_cast<int>(b)) <= 1;
}

TEST(DeviceTable, TwoHundredPooledStepsFollowTheHostTableForEveryOptimizerAndDtype) {
  constexpr int kBags = 256;
  for (const v1::OptimizerType type :
       {v1::SGD, v1::ADAGRAD, v1::ROWWISE_ADAGRAD, v1::ADAM, v1::FTRL}) {
    for (const v1::Dtype dtype : {v1::FP32, v1::FP16, v1::BF16}) {
      const v1::TableConfig config = Config(type, dtype);
      auto host = EmbeddingTable::Create(config).value();
      auto gpu = DeviceTable::Create(config, 0).value();
      const int d = config.dim();
      std::mt19937_64 gen(static_cast<uint64_t>(type) * 3 + dtype);
      std::uniform_int_distribution<int64_t> id_of(-1, 5000);
      std::uniform_int_distribution<int> size_of(0, 4);
      std::normal_distribution<float> grad_of(0.0f, 0.3f);
      for (int step = 0; step < 200; ++step) {
        std::vector<int64_t> ids;
        std::vector<int32_t> offsets = {0};
        for (int b = 0; b < kBags; ++b) {
          for (int k = size_of(gen); k > 0; --k) ids.push_back(id_of(gen));
          offsets.push_back(static_cast<int32_t>(ids.size()));
        }
        std::vector<int64_t> unique;
        std::vector<int32_t> inverse;
        Unique(ids, &unique, &inverse);
        std::vector<float> rows(unique.size() * d), want(kBags * d), got(kBags * d);
        ASSERT_TRUE(host->Lookup(unique, rows.data(), true).ok());
        PoolBags(rows.data(), d, inverse, offsets, {}, v1::MEAN, want.data());
        ASSERT_TRUE(gpu->Lookup(ids, offsets, {}, v1::MEAN, got.data(), true).ok());
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_TRUE(Close(got[i], want[i], dtype))
              << OptimizerName(type) << " " << DtypeName(dtype) << " step " << step << " value "
              << i << ": " << got[i] << " vs " << want[i];
        }
        std::vector<float> bag_grads(kBags * d);
        for (float& g : bag_grads) g = grad_of(gen);
        std::vector<float> unique_grads(unique.size() * d);
        PoolBagsBackward(bag_grads.data(), d, inverse, offsets, {}, v1::MEAN, unique.size(),
                         unique_grads.data());
        ASSERT_TRUE(host->ApplyUniqueGradients(unique, unique_grads.data(), step).ok());
        ASSERT_TRUE(
            gpu->ApplyPooledGradients(ids, offsets, {}, v1::MEAN, bag_grads.data(), step).ok());
      }
      ASSERT_EQ(gpu->num_rows(), host->num_rows());
      int64_t compared = 0;
      ASSERT_TRUE(
          gpu->ForEachRow([&](int64_t id, const float* w, const float* s, const RowMeta& meta) {
               const RowSnapshot want = host->ReadRow(id).value();
               for (int j = 0; j < d; ++j) {
                 ASSERT_TRUE(Close(w[j], want.weights[j], dtype)) << id << " " << j;
               }
               for (size_t j = 0; j < want.state.size(); ++j) {
                 ASSERT_TRUE(Close(s[j], want.state[j], v1::FP32)) << id << " " << j;
               }
               EXPECT_EQ(meta.update_count, want.meta.update_count);
               ++compared;
             })
              .ok());
      EXPECT_EQ(compared, host->num_rows());
    }
  }
}

TEST(DeviceTable, AFullTableRefusesNewRowsAndKeepsItsOwn) {
  v1::TableConfig config = Config(v1::ADAGRAD, v1::FP32);
  config.set_max_rows(10);
  auto gpu = DeviceTable::Create(config, 0).value();
  std::vector<int64_t> ids = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> out(ids.size() * 16);
  ASSERT_TRUE(gpu->Lookup(ids, {}, {}, v1::SUM, out.data(), true).ok());
  ids = {1, 100, 101, 102};  // three new: 11 rows
  const absl::Status s = gpu->Lookup(ids, {}, {}, v1::SUM, out.data(), true);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(gpu->num_rows(), 8);
  EXPECT_TRUE(gpu->Lookup(ids, {}, {}, v1::SUM, out.data(), false).ok());  // read-only: fine
}

TEST(DeviceTable, RowsPutInComeOutAndNonFiniteGradientsAreRefused) {
  const v1::TableConfig config = Config(v1::ADAM, v1::BF16);
  auto gpu = DeviceTable::Create(config, 0).value();
  const std::vector<int64_t> ids = {5, -1, int64_t{1} << 62};
  std::vector<float> w(ids.size() * 16), s(ids.size() * 32);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.125f * static_cast<float>(i % 9);
  for (size_t i = 0; i < s.size(); ++i) s[i] = 0.5f + static_cast<float>(i);
  std::vector<RowMeta> metas(ids.size());
  metas[1].update_count = 4;
  ASSERT_TRUE(gpu->PutRows(ids, w.data(), s.data(), metas).ok());
  std::map<int64_t, std::vector<float>> seen;
  ASSERT_TRUE(gpu->ForEachRow([&](int64_t id, const float* rw, const float*, const RowMeta& m) {
                   seen[id].assign(rw, rw + 16);
                   if (id == -1) {
                     EXPECT_EQ(m.update_count, 4);
                   }
                 })
                  .ok());
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[-1], std::vector<float>(w.begin() + 16, w.begin() + 32));
  std::vector<float> nan_grads(16, 0.0f);
  nan_grads[3] = NAN;
  const int64_t one[] = {5};
  EXPECT_EQ(gpu->ApplyUniqueGradients(one, nan_grads.data(), 1).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::embedding::device

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (absl::Status usable = tessera::embedding::device::DeviceTable::Usable(0); !usable.ok()) {
    std::printf("skipped: device tables cannot run here: %s\n",
                std::string(usable.message()).c_str());
    return 77;
  }
  return RUN_ALL_TESTS();
}
