// The device table's per-thread functions (table_core.h), run on the CPU a thread at a
// time the way its kernels run them, against the host EmbeddingTable: the same seed and
// batches give the same rows, bit for bit, for every optimizer and dtype.

#include "embedding/device/table_core.h"

#include <cstring>
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

// A table_core table in host memory, driven as the kernels drive it: deduplicate, claim
// and fill missing rows, then one "thread" per distinct id or per output element.
class CoreTable {
 public:
  explicit CoreTable(const v1::TableConfig& config) : layout_(DescribeTable(config).value()) {
    TableView& v = layout_.view;
    keys_.assign(v.slots + 1, kEmptyKey);
    weights_.assign(layout_.weights_bytes(), 0);
    state_.assign((v.slots + 1) * v.state_floats, 0.0f);
    update_count_.assign(v.slots + 1, 0);
    last_step_.assign(v.slots + 1, 0);
    v.keys = keys_.data();
    v.weights = weights_.data();
    v.state = state_.data();
    v.update_count = update_count_.data();
    v.last_step = last_step_.data();
    v.rows = &rows_;
  }

  const TableView& view() const { return layout_.view; }
  int64_t rows() const { return static_cast<int64_t>(rows_); }

  // Rows of `ids` (ids.size(), dim), created when missing and `insert`.
  std::vector<float> Lookup(const std::vector<int64_t>& ids, bool insert) {
    std::vector<int64_t> unique;
    std::vector<int32_t> inverse;
    Unique(ids, &unique, &inverse);
    const std::vector<float> rows = UniqueRows(unique, insert);
    const int d = view().dim;
    std::vector<float> out(ids.size() * d);
    for (size_t i = 0; i < ids.size(); ++i) {
      std::memcpy(out.data() + i * d, rows.data() + static_cast<size_t>(inverse[i]) * d,
                  d * sizeof(float));
    }
    return out;
  }

  std::vector<float> UniqueRows(const std::vector<int64_t>& unique, bool insert) {
    const int d = view().dim;
    std::vector<float> rows(unique.size() * d), scratch(d);
    for (size_t u = 0; u < unique.size(); ++u) {
      int64_t slot = FindSlot(view(), unique[u]);
      if (slot < 0 && insert) {
        bool created = false;
        slot = ClaimSlot(view(), unique[u], &created);
        EXPECT_TRUE(created);
        InitRow(view(), slot, unique[u], scratch.data());
      }
      if (slot >= 0) {
        ReadWeights(view(), slot, rows.data() + u * d);
      } else {
        InitialWeights(view(), unique[u], rows.data() + u * d);
      }
    }
    return rows;
  }

  // Applies summed gradients of distinct ids; returns how many rows refused.
  int Apply(const std::vector<int64_t>& unique, const std::vector<float>& grads, int64_t step) {
    const int d = view().dim;
    std::vector<float> scratch(2 * d + view().state_floats);
    int refused = 0;
    for (size_t u = 0; u < unique.size(); ++u) {
      bool created = false;
      const int64_t slot = ClaimSlot(view(), unique[u], &created);
      if (created) InitRow(view(), slot, unique[u], scratch.data());
      if (!UpdateRow(view(), slot, unique[u], grads.data() + u * d, step, scratch.data())) {
        ++refused;
      }
    }
    return refused;
  }

 private:
  TableLayout layout_;
  std::vector<uint64_t> keys_;
  std::vector<uint8_t> weights_;
  std::vector<float> state_;
  std::vector<int64_t> update_count_, last_step_;
  unsigned long long rows_ = 0;
};

uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

void ExpectSameBits(const float* a, const float* b, int n, const std::string& what) {
  for (int j = 0; j < n; ++j) {
    ASSERT_EQ(BitsOf(a[j]), BitsOf(b[j]))
        << what << " column " << j << ": " << a[j] << " vs " << b[j];
  }
}

v1::TableConfig Config(v1::OptimizerType type, v1::Dtype dtype) {
  v1::TableConfig c = testing::TestTable("t", 12, 2024, type, 0.05f);
  c.set_dtype(dtype);
  c.set_max_rows(4000);
  if (type == v1::FTRL) {
    c.mutable_optimizer()->set_l1(0.001f);
    c.mutable_optimizer()->set_initial_accumulator(0.1f);
  }
  if (type == v1::ROWWISE_ADAGRAD) c.mutable_optimizer()->set_clip_norm(0.5f);
  if (type == v1::ADAM) c.mutable_optimizer()->set_weight_decay(0.01f);
  return c;
}

TEST(DeviceTableCore, TwoHundredStepsMatchTheHostTableForEveryOptimizerAndDtype) {
  for (const v1::OptimizerType type :
       {v1::SGD, v1::ADAGRAD, v1::ROWWISE_ADAGRAD, v1::ADAM, v1::FTRL}) {
    for (const v1::Dtype dtype : {v1::FP32, v1::FP16, v1::BF16}) {
      const v1::TableConfig config = Config(type, dtype);
      auto host = EmbeddingTable::Create(config).value();
      CoreTable core(config);
      const int d = config.dim();
      std::mt19937_64 gen(static_cast<uint64_t>(type) * 10 + dtype);
      std::uniform_int_distribution<int64_t> id_of(-1, 600);  // -1 is the empty key's id
      std::normal_distribution<float> grad_of(0.0f, 0.3f);
      for (int step = 0; step < 200; ++step) {
        std::vector<int64_t> ids(48);
        for (int64_t& id : ids) id = id_of(gen);
        std::vector<float> want(ids.size() * d);
        ASSERT_TRUE(host->Lookup(ids, want.data(), /*insert_missing=*/true).ok());
        const std::vector<float> got = core.Lookup(ids, /*insert=*/true);
        ExpectSameBits(got.data(), want.data(), static_cast<int>(got.size()), "lookup");
        std::vector<int64_t> unique;
        std::vector<int32_t> inverse;
        Unique(ids, &unique, &inverse);
        std::vector<float> grads(unique.size() * d);
        for (float& g : grads) g = grad_of(gen);
        ASSERT_TRUE(host->ApplyUniqueGradients(unique, grads.data(), step).ok());
        ASSERT_EQ(core.Apply(unique, grads, step), 0);
      }
      EXPECT_EQ(core.rows(), host->num_rows());
      // Every row: weights, state and counters.
      int checked = 0;
      host->ForEachRow([&](int64_t id, const float* w, const float* s, const RowMeta& meta) {
        const int64_t slot = FindSlot(core.view(), id);
        ASSERT_GE(slot, 0) << id;
        std::vector<float> cw(d), cs(core.view().state_floats);
        int64_t updates = 0, last = 0;
        ExportRow(core.view(), slot, cw.data(), cs.data(), &updates, &last);
        const std::string what =
            OptimizerName(type) + " " + DtypeName(dtype) + " id " + std::to_string(id);
        ExpectSameBits(cw.data(), w, d, what + " weights");
        ExpectSameBits(cs.data(), s, core.view().state_floats, what + " state");
        EXPECT_EQ(updates, meta.update_count) << what;
        EXPECT_EQ(last, meta.last_step) << what;
        ++checked;
      });
      EXPECT_EQ(checked, core.rows());
    }
  }
}

TEST(DeviceTableCore, ALookupWithoutInsertAnswersInitialWeightsAndStoresNothing) {
  const v1::TableConfig config = Config(v1::ADAGRAD, v1::BF16);
  auto host = EmbeddingTable::Create(config).value();
  CoreTable core(config);
  const std::vector<int64_t> ids = {7, 9, 7, int64_t{1} << 60};
  std::vector<float> want(ids.size() * config.dim());
  ASSERT_TRUE(host->Lookup(ids, want.data(), /*insert_missing=*/false).ok());
  const std::vector<float> got = core.Lookup(ids, /*insert=*/false);
  ExpectSameBits(got.data(), want.data(), static_cast<int>(got.size()), "read-only lookup");
  EXPECT_EQ(core.rows(), 0);
  EXPECT_EQ(FindSlot(core.view(), 7), -1);
}

TEST(DeviceTableCore, AFullMapClaimsNoMoreSlotsAndFindsEveryRowItHas) {
  v1::TableConfig config = Config(v1::SGD, v1::FP32);
  config.set_max_rows(3);  // 4 slots
  CoreTable core(config);
  ASSERT_EQ(core.view().slots, 4u);
  std::vector<float> scratch(config.dim());
  for (int64_t id = 100; id < 104; ++id) {
    bool created = false;
    const int64_t slot = ClaimSlot(core.view(), id, &created);
    ASSERT_GE(slot, 0);
    EXPECT_TRUE(created);
    InitRow(core.view(), slot, id, scratch.data());
  }
  bool created = true;
  EXPECT_EQ(ClaimSlot(core.view(), 104, &created), -1);
  EXPECT_FALSE(created);
  EXPECT_EQ(FindSlot(core.view(), 104), -1);
  for (int64_t id = 100; id < 104; ++id) {
    const int64_t slot = ClaimSlot(core.view(), id, &created);
    EXPECT_EQ(slot, FindSlot(core.view(), id));
    EXPECT_FALSE(created) << id;
  }
  // The empty key's id has its own slot whatever the map holds.
  EXPECT_EQ(ClaimSlot(core.view(), -1, &created), static_cast<int64_t>(core.view().slots));
  EXPECT_TRUE(created);
  EXPECT_EQ(FindSlot(core.view(), -1), static_cast<int64_t>(core.view().slots));
}

TEST(DeviceTableCore, ANonFiniteStepLeavesTheRowAsItWas) {
  for (const v1::Dtype dtype : {v1::FP32, v1::BF16}) {
    v1::TableConfig config = Config(v1::ADAGRAD, dtype);
    config.mutable_optimizer()->set_learning_rate(1e30f);
    CoreTable core(config);
    const int d = config.dim();
    const int sf = core.view().state_floats;
    core.Lookup({5}, true);
    const int64_t slot = FindSlot(core.view(), 5);
    std::vector<float> before(d), after(d), state_before(sf), state_after(sf);
    int64_t updates = 0, last = 0;
    ExportRow(core.view(), slot, before.data(), state_before.data(), &updates, &last);
    // The accumulator overflows (3e38^2): refused, and nothing of the row moves.
    EXPECT_EQ(core.Apply({5}, std::vector<float>(d, 3e38f), 1), 1);
    ExportRow(core.view(), slot, after.data(), state_after.data(), &updates, &last);
    ExpectSameBits(after.data(), before.data(), d, "refused row's weights");
    ExpectSameBits(state_after.data(), state_before.data(), sf, "refused row's state");
    EXPECT_EQ(updates, 0);
    EXPECT_EQ(last, -1);
  }
}

TEST(DeviceTableCore, ImportedRowsExportAsTheyCame) {
  const v1::TableConfig config = Config(v1::ADAM, v1::FP32);
  CoreTable core(config);
  const int d = config.dim();
  const int sf = core.view().state_floats;
  std::vector<float> w(d), s(sf);
  for (int j = 0; j < d; ++j) w[j] = 0.25f * j - 1.0f;
  for (int j = 0; j < sf; ++j) s[j] = 0.5f + j;
  ASSERT_TRUE(ImportRow(core.view(), 42, w.data(), s.data(), 7, 99));
  ASSERT_TRUE(ImportRow(core.view(), 42, w.data(), s.data(), 8, 100));  // replaces
  EXPECT_EQ(core.rows(), 1);
  std::vector<float> w2(d), s2(sf);
  int64_t updates = 0, last = 0;
  ExportRow(core.view(), FindSlot(core.view(), 42), w2.data(), s2.data(), &updates, &last);
  EXPECT_EQ(w2, w);
  EXPECT_EQ(s2, s);
  EXPECT_EQ(updates, 8);
  EXPECT_EQ(last, 100);
}

TEST(DeviceTableCore, PoolingAndItsBackwardSumAsTheHostDoes) {
  constexpr int kDim = 10;
  std::mt19937 gen(5);
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::uniform_int_distribution<int> id_of(0, 30), bag_size(0, 6);
  for (const bool weighted : {false, true}) {
    for (const v1::Pooling pooling : {v1::SUM, v1::MEAN, v1::SQRTN}) {
      std::vector<int64_t> ids;
      std::vector<int32_t> offsets = {0};
      for (int b = 0; b < 40; ++b) {
        for (int k = bag_size(gen); k > 0; --k) ids.push_back(id_of(gen));
        offsets.push_back(static_cast<int32_t>(ids.size()));
      }
      std::vector<float> weights;
      if (weighted) {
        for (size_t i = 0; i < ids.size(); ++i) weights.push_back(value(gen));
      }
      std::vector<int64_t> unique;
      std::vector<int32_t> inverse;
      Unique(ids, &unique, &inverse);
      std::vector<float> rows(unique.size() * kDim);
      for (float& r : rows) r = value(gen);
      const size_t bags = offsets.size() - 1;
      std::vector<float> want(bags * kDim), got(bags * kDim);
      PoolBags(rows.data(), kDim, inverse, offsets, weights, pooling, want.data());
      const float* w = weighted ? weights.data() : nullptr;
      for (size_t b = 0; b < bags; ++b) {
        for (int j = 0; j < kDim; ++j) {
          got[b * kDim + j] = PoolColumn(rows.data(), kDim, inverse.data(), offsets.data(), w,
                                         PoolingKindOf(pooling), static_cast<int64_t>(b), j);
        }
      }
      ExpectSameBits(got.data(), want.data(), static_cast<int>(got.size()), "pooled");

      std::vector<float> bag_grads(bags * kDim);
      for (float& g : bag_grads) g = value(gen);
      std::vector<float> want_grads(unique.size() * kDim), got_grads(unique.size() * kDim);
      PoolBagsBackward(bag_grads.data(), kDim, inverse, offsets, weights, pooling, unique.size(),
                       want_grads.data());
      // Positions of each distinct id in ascending order (what a stable sort by id gives)
      // and each position's bag.
      std::vector<std::vector<int32_t>> positions(unique.size());
      std::vector<int32_t> bag_of(ids.size());
      for (size_t b = 0; b < bags; ++b) {
        for (int32_t k = offsets[b]; k < offsets[b + 1]; ++k) bag_of[k] = static_cast<int32_t>(b);
      }
      for (size_t k = 0; k < ids.size(); ++k)
        positions[inverse[k]].push_back(static_cast<int32_t>(k));
      for (size_t u = 0; u < unique.size(); ++u) {
        for (int j = 0; j < kDim; ++j) {
          got_grads[u * kDim + j] =
              UniqueGradColumn(bag_grads.data(), kDim, positions[u].data(),
                               static_cast<int32_t>(positions[u].size()), bag_of.data(),
                               offsets.data(), w, PoolingKindOf(pooling), j);
        }
      }
      ExpectSameBits(got_grads.data(), want_grads.data(), static_cast<int>(got_grads.size()),
                     "pooling backward");
    }
  }
}

TEST(DeviceTableCore, ALayoutRefusesEvictionAndSizesItsSlots) {
  v1::TableConfig config = Config(v1::ADAGRAD, v1::BF16);
  config.set_max_rows(1000);
  const TableLayout layout = DescribeTable(config).value();
  EXPECT_EQ(layout.max_rows, 1000);
  EXPECT_EQ(layout.view.slots, 1334u);  // 1000 / 0.75, rounded up
  EXPECT_EQ(layout.weight_bytes, 2);
  EXPECT_EQ(layout.view.state_floats, 12);
  config.set_max_rows(0);
  EXPECT_EQ(DescribeTable(config)->max_rows, kDefaultDeviceRows);
  config.set_dim(kMaxDeviceDim + 1);
  EXPECT_EQ(DescribeTable(config).status().code(), absl::StatusCode::kInvalidArgument);
  config.set_dim(12);
  config.mutable_eviction()->set_policy(v1::EVICTION_LRU);
  const absl::Status s = DescribeTable(config).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("eviction"), std::string::npos) << s;
}

}  // namespace
}  // namespace tessera::embedding::device
