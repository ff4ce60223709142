// Lock-free lookups against writers that update, create, erase and re-create rows and
// grow the id maps, all at once. Built twice: in the regular build, and with ASan and
// UBSan into build-fuzz/ (scripts/fuzz.sh build), where a lookup that read a freed map
// or slab would be reported (tests/sanitized_stress_test.sh runs that build in CI).
//
// Bounded: every thread stops after a fixed number of rounds.

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "embedding/embedding_table.h"
#include "gtest/gtest.h"
#include "tests/support/table_configs.h"

namespace tessera::embedding {
namespace {

constexpr int kDim = 16;

v1::TableConfig ZeroSgd() {
  v1::TableConfig c = testing::TestTable("stress", kDim, 0, v1::SGD, 1.0f);
  c.mutable_initializer()->set_type(v1::ZEROS);
  return c;
}

// A row a reader may see for `id`: all columns equal, and (when not the initial zeros)
// the id in the integer part, so a torn row, a row of another id (its memory reused) or
// a half-moved map entry is caught.
bool Plausible(int64_t id, const float* row) {
  for (int j = 1; j < kDim; ++j) {
    if (row[j] != row[0]) return false;
  }
  return row[0] == 0.0f || static_cast<int64_t>(row[0]) == id;
}

TEST(EmbeddingTableStress, LockFreeLookupsSeeWholeRowsOfTheirOwnIdsWhileWritersChurn) {
  auto table = EmbeddingTable::Create(ZeroSgd()).value();
  EmbeddingTable& t = *table;
  constexpr int kChurnIds = 4096;  // put, updated, forgotten and put again
  constexpr int kGrowIds = 60000;  // created in order: the maps keep growing
  constexpr int kRounds = 60;
  std::atomic<int64_t> bad{0}, reads{0};
  std::atomic<bool> writers_done{false};

  // Writer 1: rows of the churn ids are put as `id + 0.25`, then moved by SGD steps of
  // -0.125 per column (whole rows of equal columns), then forgotten, round after round.
  std::thread churn([&] {
    std::vector<int64_t> ids;
    for (int64_t id = 1; id <= kChurnIds; ++id) ids.push_back(id);
    std::vector<float> grads(ids.size() * kDim, -0.125f);
    std::vector<float> state;
    for (int r = 0; r < kRounds; ++r) {
      for (const int64_t id : ids) {
        std::vector<float> w(kDim, static_cast<float>(id) + 0.25f);
        ASSERT_TRUE(t.PutRow(id, w, state, RowMeta{}).ok());
      }
      ASSERT_TRUE(t.ApplyUniqueGradients(ids, grads.data(), r).ok());
      for (size_t i = r % 2; i < ids.size(); i += 2) t.Forget(ids[i]);
    }
  });
  // Writer 2: new rows far from the churn ids, so every stripe's map grows while the
  // readers probe it; their weights are id + 0.5 (put) or 0 (created by an update).
  std::thread grow([&] {
    std::vector<float> grads(64 * kDim, 0.0f);
    std::vector<float> state;
    for (int64_t base = 0; base < kGrowIds; base += 128) {
      std::vector<int64_t> created;
      for (int64_t i = 0; i < 64; ++i) created.push_back(1000000 + base + i);
      ASSERT_TRUE(t.ApplyUniqueGradients(created, grads.data(), 0).ok());
      for (int64_t i = 64; i < 128; ++i) {
        const int64_t id = 1000000 + base + i;
        std::vector<float> w(kDim, static_cast<float>(id) + 0.5f);
        ASSERT_TRUE(t.PutRow(id, w, state, RowMeta{}).ok());
      }
    }
  });
  auto reader = [&](uint64_t seed) {
    std::vector<int64_t> ids(512);
    std::vector<float> out(ids.size() * kDim);
    uint64_t x = seed;
    while (!writers_done.load()) {
      for (auto& id : ids) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        id = (x & 1) ? static_cast<int64_t>(1 + (x >> 8) % kChurnIds)
                     : static_cast<int64_t>(1000000 + (x >> 8) % kGrowIds);
      }
      // Read-only: missing rows answer their initial zeros and are not created.
      ASSERT_TRUE(t.Lookup(ids, out.data(), /*insert_missing=*/false).ok());
      for (size_t i = 0; i < ids.size(); ++i) {
        if (!Plausible(ids[i], out.data() + i * kDim)) bad.fetch_add(1);
      }
      reads.fetch_add(static_cast<int64_t>(ids.size()));
    }
  };
  std::thread r1(reader, 0x9e3779b97f4a7c15ULL), r2(reader, 0xbf58476d1ce4e5b9ULL);
  churn.join();
  grow.join();
  writers_done = true;
  r1.join();
  r2.join();
  EXPECT_EQ(bad.load(), 0) << "of " << reads.load() << " rows read";
  EXPECT_GT(reads.load(), 0);
  // Every grown row is there with what its writer left.
  std::vector<float> row(kDim);
  for (int64_t id = 1000000; id < 1000000 + kGrowIds; id += 97) {
    absl::StatusOr<RowSnapshot> snap = t.ReadRow(id);
    ASSERT_TRUE(snap.ok()) << id;
    const float want = (id - 1000000) % 128 < 64 ? 0.0f : static_cast<float>(id) + 0.5f;
    EXPECT_EQ(snap->weights[0], want) << id;
  }
}

TEST(EmbeddingTableStress, ConcurrentUpdatersLoseNoStepAndReadersNeverSeeHalfASteps) {
  // SGD with lr 1 and gradient -1: every applied step adds exactly 1 to every column.
  auto table = EmbeddingTable::Create(ZeroSgd()).value();
  EmbeddingTable& t = *table;
  constexpr int kIds = 2048, kSteps = 200;
  std::atomic<int64_t> torn{0};
  std::atomic<bool> done{false};
  auto updater = [&] {
    std::vector<int64_t> ids(kIds);
    for (int i = 0; i < kIds; ++i) ids[i] = i * 7919;
    std::vector<float> grads(ids.size() * kDim, -1.0f);
    for (int s = 0; s < kSteps; ++s) ASSERT_TRUE(t.ApplyUniqueGradients(ids, grads.data(), s).ok());
  };
  auto reader = [&] {
    std::vector<int64_t> ids(kIds);
    for (int i = 0; i < kIds; ++i) ids[i] = i * 7919;
    std::vector<float> out(ids.size() * kDim);
    while (!done.load()) {
      ASSERT_TRUE(t.Lookup(ids, out.data()).ok());
      for (int i = 0; i < kIds; ++i) {
        for (int j = 1; j < kDim; ++j) torn += out[i * kDim + j] != out[i * kDim];
      }
    }
  };
  std::thread u1(updater), u2(updater), r(reader);
  u1.join();
  u2.join();
  done = true;
  r.join();
  EXPECT_EQ(torn.load(), 0);
  for (int i = 0; i < kIds; i += 31) {
    absl::StatusOr<RowSnapshot> snap = t.ReadRow(i * 7919);
    ASSERT_TRUE(snap.ok());
    EXPECT_EQ(snap->weights[5], 2.0f * kSteps);
    EXPECT_EQ(snap->meta.update_count, 2 * kSteps);
  }
}

}  // namespace
}  // namespace tessera::embedding
