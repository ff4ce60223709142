// The storage under a dynamic table: the cuckoo id map of a stripe, the row store, and
// the table's rows at their payload's size (meta packed into 8 bytes).

#include "embedding/internal/row_store.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "embedding/embedding_table.h"
#include "embedding/internal/stripe.h"
#include "gtest/gtest.h"
#include "tests/support/table_configs.h"

namespace tessera::embedding {
namespace {

using embedding_internal::IdMap;
using embedding_internal::kNoRow;
using embedding_internal::MapHash;
using embedding_internal::MapId;
using embedding_internal::ReaderEpochs;
using embedding_internal::ReaderScope;
using embedding_internal::RowStore;
using embedding_internal::Stripe;
using embedding_internal::StripeWriter;

TEST(MapIdTest, InvertsTheMapHash) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 10000; ++i) {
    const int64_t id = static_cast<int64_t>(rng());
    ASSERT_EQ(MapId(MapHash(id)), id);
  }
  for (const int64_t id : {int64_t{0}, int64_t{-1}, std::numeric_limits<int64_t>::min(),
                           std::numeric_limits<int64_t>::max()}) {
    EXPECT_EQ(MapId(MapHash(id)), id);
  }
}

// Every id placed is found, every id erased is gone, and ids never placed are not found,
// through a mix of places and erases that fills the map to its load limit each round.
TEST(IdMapTest, FindsWhatItHoldsAtHighLoadThroughErases) {
  for (const uint64_t capacity : {uint64_t{17}, uint64_t{1000}, uint64_t{4099}}) {
    std::unique_ptr<IdMap> map = IdMap::Create(capacity);
    ASSERT_NE(map, nullptr);
    std::mt19937_64 rng(capacity);
    std::vector<uint64_t> held;
    std::set<uint64_t> gone;
    for (int round = 0; round < 20; ++round) {
      // A walk may find no room short of the limit (the stripe then grows the map); a
      // failed walk changes nothing.
      while (held.size() < map->limit()) {
        const uint64_t h = MapHash(static_cast<int64_t>(rng()));
        if (!map->Place(h, static_cast<uint32_t>(held.size() * 7 + round))) {
          gone.insert(h);
          break;
        }
        held.push_back(h);
      }
      if (capacity >= 1000) {
        ASSERT_GE(held.size(), map->capacity() * 8 / 10) << "capacity " << capacity;
      }
      // Erase a third, at random.
      for (size_t k = 0; k < held.size() / 3; ++k) {
        const size_t at = rng() % held.size();
        const int64_t slot = map->FindSlot(held[at]);
        ASSERT_GE(slot, 0);
        map->EraseSlot(static_cast<uint64_t>(slot));
        gone.insert(held[at]);
        held[at] = held.back();
        held.pop_back();
      }
      for (const uint64_t h : held) ASSERT_NE(map->Find(h), kNoRow) << "capacity " << capacity;
      for (const uint64_t h : gone) {
        if (std::find(held.begin(), held.end(), h) == held.end()) {
          ASSERT_EQ(map->Find(h), kNoRow);
        }
      }
      for (int k = 0; k < 100; ++k)
        ASSERT_EQ(map->Find(MapHash(static_cast<int64_t>(rng()))), kNoRow);
    }
  }
}

// A stripe over a row store of rows of `weight_bytes` bytes of weights (64 by default),
// with its table's reader count.
struct TestStripe {
  explicit TestStripe(int weight_bytes = 64) : rows(weight_bytes, 0) {
    stripe.Init(&readers, &rows);
  }
  ReaderEpochs readers;
  RowStore rows;
  Stripe stripe;
};

// Inserts 200k ids into `stripe`, checking that its map stays at most `limit` full and
// no lower than a tenth under it (past its first sizes), and finds them all.
void FillsNearItsLimit(Stripe& stripe, double limit) {
  StripeWriter lock(stripe);
  std::set<uint32_t> numbers;
  double lowest = 1.0;
  for (int64_t i = 0; i < 200000; ++i) {
    const uint32_t row = stripe.Insert(MapHash(i));
    ASSERT_NE(row, kNoRow);
    ASSERT_TRUE(numbers.insert(row).second) << "row " << row << " handed out twice";
    if (i >= 10000) {
      const double load =
          static_cast<double>(stripe.size()) / static_cast<double>(stripe.current()->capacity());
      lowest = std::min(lowest, load);
      ASSERT_LE(load, limit) << i;
    }
  }
  // Grown by a tenth at the limit (a walk that found no room grows it a little early).
  EXPECT_GE(lowest, limit / 1.1 - 0.02);
  int64_t second = 0;  // ids their first bucket does not settle: a second line to read
  for (int64_t i = 0; i < 200000; ++i) {
    ASSERT_NE(stripe.Find(MapHash(i)), kNoRow);
    uint32_t row;
    second += !stripe.current()->FindInFirst(MapHash(i), &row);
  }
  const double in_second = static_cast<double>(second) / 200000.0;
  std::printf(
      "load %.3f (lowest %.3f) of %.2f: %.1f%% of ids in their second bucket\n",
      static_cast<double>(stripe.size()) / static_cast<double>(stripe.current()->capacity()),
      lowest, limit, 100.0 * in_second);
  // What the lower limit of wide rows is for (IdMap::LoadFor).
  if (limit <= IdMap::kWideLoad) {
    EXPECT_LT(in_second, 0.08);
  }
}

// A stripe's map stays near its load limit as it grows (past its first sizes): 0.94 over
// narrow rows (72 bytes: 64 of weights and the meta), 0.6 over rows of 256 bytes or more.
TEST(StripeTest, GrowsByATenthAndStaysNearItsLoadLimit) {
  for (const auto& [weight_bytes, limit] : {std::pair{64, 0.94}, std::pair{256, 0.6}}) {
    SCOPED_TRACE(weight_bytes);
    TestStripe fixture(weight_bytes);
    ASSERT_TRUE(fixture.rows.ok());
    EXPECT_EQ(IdMap::LoadFor(fixture.rows.row_bytes()), limit);
    FillsNearItsLimit(fixture.stripe, limit);
  }
}

// Maps replaced as a stripe grows are freed while lock-free readers keep coming: three
// readers that each hold the table for a millisecond at a time, so that some reader is
// nearly always inside (a single count of readers in flight would rarely or never be zero).
TEST(StripeTest, ReplacedMapsAreFreedWhileReadersKeepComing) {
  TestStripe fixture;
  ASSERT_TRUE(fixture.rows.ok());
  Stripe& stripe = fixture.stripe;
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      std::this_thread::sleep_for(std::chrono::microseconds(300 * t));
      for (int i = 0; i < 20000 && !done.load(); ++i) {
        ReaderScope reading(fixture.readers);
        const IdMap* map = stripe.map();
        if (map != nullptr) (void)map->Find(MapHash(i));  // a probe of whatever map is published
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
  }
  size_t most = 0;
  for (int64_t i = 0; i < 100000; ++i) {
    StripeWriter lock(stripe);
    ASSERT_NE(stripe.Insert(MapHash(i)), kNoRow);
    most = std::max(most, stripe.retired_maps());
  }
  // Every map replaced gets freed within a few of the readers' turns (bounded wait).
  for (int k = 0; k < 5000 && stripe.retired_maps() > 0; ++k) {
    StripeWriter lock(stripe);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const size_t left = stripe.retired_maps();
  const int32_t inside = fixture.readers.readers();
  done = true;
  for (auto& t : threads) t.join();
  std::printf("at most %zu replaced maps kept; %d readers inside at the end\n", most, inside);
  EXPECT_EQ(left, 0u);
  for (int64_t i = 0; i < 100000; ++i) ASSERT_NE(stripe.Find(MapHash(i)), kNoRow);
}

// Writes every byte of weights, state and meta of two chunks' rows and a few more, then
// reads each back: no row's parts overlap another's (or its own). Small blocks first (as a
// table's stripes take them), then whole ones: none overlaps another.
void ExpectRowsOwnTheirBytes(RowStore& rows, int weight_bytes, int state_floats) {
  std::vector<uint32_t> seen;
  for (const uint32_t small : {2u, 4u, 2u, 8u, 16u, 32u, 4u}) {
    uint32_t first = 0;
    ASSERT_TRUE(rows.TakeBlock(&first, small));
    for (uint32_t r = first; r < first + small; ++r) seen.push_back(r);
  }
  for (uint32_t b = 0; b < 2 * rows.chunk_rows() / RowStore::kBlockRows + 3; ++b) {
    uint32_t first = 0;
    ASSERT_TRUE(rows.TakeBlock(&first));
    for (uint32_t r = first; r < first + RowStore::kBlockRows; ++r) seen.push_back(r);
  }
  std::sort(seen.begin(), seen.end());
  ASSERT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end()) << "a row taken twice";
  const uint32_t n = rows.HandedOut();
  for (uint32_t r = 0; r < n; ++r) {
    ASSERT_TRUE(rows.Valid(r));
    std::memset(rows.Weights(r), static_cast<int>(r & 0xff), weight_bytes);
    for (int k = 0; k < state_floats; ++k) rows.State(r)[k] = static_cast<float>(r);
    rows.Meta(r)->updates = r;
    rows.Meta(r)->step = ~r;
  }
  EXPECT_FALSE(rows.Valid(n));
  for (uint32_t r = 0; r < n; ++r) {
    const auto* w = reinterpret_cast<const unsigned char*>(rows.Weights(r));
    ASSERT_EQ(w[0], r & 0xff);
    ASSERT_EQ(w[weight_bytes - 1], r & 0xff);
    ASSERT_EQ(rows.State(r)[0], static_cast<float>(r));
    ASSERT_EQ(rows.State(r)[state_floats - 1], static_cast<float>(r));
    ASSERT_EQ(rows.Meta(r)->updates, r);
    ASSERT_EQ(rows.Meta(r)->step, ~r);
  }
  EXPECT_GE(rows.Bytes(), int64_t{n} * (weight_bytes + state_floats * 4 + 8));
}

TEST(RowStoreTest, RowsDoNotOverlapAndDirtyBitsAreTheirOwn) {
  RowStore rows(/*weight_bytes=*/36, /*state_floats=*/3);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows.cold_bytes(), 3 * 4 + 8);
  EXPECT_FALSE(rows.together());
  EXPECT_EQ(rows.row_bytes(), 36 + 20);
  // 36-byte weights (two twos) and 20-byte cold parts: chunks of 2^19 rows.
  EXPECT_EQ(rows.chunk_rows(), uint32_t{1} << 19);
  ASSERT_NO_FATAL_FAILURE(ExpectRowsOwnTheirBytes(rows, 36, 3));
  EXPECT_TRUE(rows.SetDirty(70));
  EXPECT_FALSE(rows.SetDirty(70));
  EXPECT_TRUE(rows.Dirty(70));
  EXPECT_FALSE(rows.Dirty(71));
  EXPECT_FALSE(rows.Dirty(69));
  EXPECT_TRUE(rows.ClearDirty(70));
  EXPECT_FALSE(rows.ClearDirty(70));
}

// Wide rows with state keep weights, state and meta together, the row padded to whole
// lines when that adds at most an eighth (dim 64 fp32 Adagrad: 256 + 256 + 8 -> 576); the
// weights start on a line. Narrow rows, or padding that would add more, stay apart.
TEST(RowStoreTest, WideRowsWithStateSitTogetherOnWholeLines) {
  RowStore rows(/*weight_bytes=*/256, /*state_floats=*/64);
  ASSERT_TRUE(rows.ok());
  EXPECT_TRUE(rows.together());
  EXPECT_EQ(rows.row_bytes(), 576);
  ASSERT_NO_FATAL_FAILURE(ExpectRowsOwnTheirBytes(rows, 256, 64));
  for (uint32_t r : {0u, 1u, 70u, rows.chunk_rows() + 5}) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(rows.Weights(r)) % 64, 0u) << r;
    EXPECT_EQ(reinterpret_cast<const char*>(rows.State(r)),
              reinterpret_cast<const char*>(rows.Weights(r)) + 256)
        << r;
  }
  EXPECT_EQ(reinterpret_cast<const char*>(rows.Weights(2)) -
                reinterpret_cast<const char*>(rows.Weights(1)),
            576);
  EXPECT_FALSE(RowStore(/*weight_bytes=*/64, /*state_floats=*/16).together());  // dim 16
  EXPECT_FALSE(RowStore(/*weight_bytes=*/256, /*state_floats=*/0).together());  // SGD
  EXPECT_FALSE(RowStore(/*weight_bytes=*/256, /*state_floats=*/1).together());  // +56 of 268
  RowStore adam(/*weight_bytes=*/256, /*state_floats=*/128);
  EXPECT_TRUE(adam.together());
  EXPECT_EQ(adam.row_bytes(), 832);
}

v1::TableConfig Config(v1::OptimizerType type, v1::Dtype dtype = v1::FP32) {
  v1::TableConfig c = testing::TestTable("t", 16, /*seed=*/0, type, 0.1f);
  c.set_dtype(dtype);
  return c;
}

// The meta a row is given is the meta it reads back: the last step widened against the
// table's newest, the update count saturating at 2^32 - 1.
TEST(PackedMetaTest, LastStepsAndCountsReadBackAsStored) {
  auto table = EmbeddingTable::Create(Config(v1::ADAM)).value();
  const std::vector<float> w(16, 0.5f), state(32, 0.25f);
  const int64_t big = (int64_t{1} << 40) + 12345;
  struct Case {
    int64_t id, last_step, update_count;
  };
  // Steps within 2^32 of the newest (a row 2^32 or more behind it reads as more recent).
  const std::vector<Case> cases = {{1, -1, 0},           {2, big - (int64_t{1} << 32) + 1, 1},
                                   {3, big - 100000, 3}, {4, big, 99},
                                   {5, big - 3, 5},      {6, big - 1, int64_t{1} << 33}};
  for (const Case& c : cases) {
    ASSERT_TRUE(table->PutRow(c.id, w, state, RowMeta{c.last_step, c.update_count}).ok());
  }
  for (const Case& c : cases) {
    absl::StatusOr<RowSnapshot> row = table->ReadRow(c.id);
    ASSERT_TRUE(row.ok());
    EXPECT_EQ(row->meta.last_step, c.last_step) << c.id;
    EXPECT_EQ(row->meta.update_count, std::min<int64_t>(c.update_count, 0xffffffffLL)) << c.id;
    EXPECT_EQ(row->weights, w);
    EXPECT_EQ(row->state, state);
  }
  // An update records its step and counts one more.
  const std::vector<int64_t> ids = {3};
  const std::vector<float> g(16, 0.01f);
  ASSERT_TRUE(table->ApplyUniqueGradients(ids, g.data(), big + 1).ok());
  EXPECT_EQ(table->ReadRow(3)->meta.last_step, big + 1);
  EXPECT_EQ(table->ReadRow(3)->meta.update_count, 4);
  EXPECT_EQ(table->ReadRow(4)->meta.last_step, big);
  EXPECT_EQ(table->ReadRow(1)->meta.last_step, -1);

  // Small steps, as most runs have.
  auto small = EmbeddingTable::Create(Config(v1::SGD, v1::BF16)).value();
  const std::vector<float> none;
  ASSERT_TRUE(small->PutRow(1, w, none, RowMeta{0, 1}).ok());
  ASSERT_TRUE(small->PutRow(2, w, none, RowMeta{7, 3}).ok());
  ASSERT_TRUE(small->ApplyUniqueGradients(std::vector<int64_t>{3}, g.data(), 5).ok());
  EXPECT_EQ(small->ReadRow(1)->meta.last_step, 0);
  EXPECT_EQ(small->ReadRow(2)->meta.last_step, 7);
  EXPECT_EQ(small->ReadRow(3)->meta.last_step, 5);
  EXPECT_EQ(small->ReadRow(3)->meta.update_count, 1);
}

// Rows take their payload and 8 bytes of meta, and the maps 12.8 bytes a slot at a load of
// about 0.85 (bf16 SGD at dim 16: 32 bytes of payload, at most 56 in all).
TEST(RowSizeTest, MemoryPerRowIsThePayloadAndLittleMore) {
  for (const v1::Dtype dtype : {v1::FP32, v1::BF16}) {
    for (const v1::OptimizerType type : {v1::SGD, v1::ADAGRAD, v1::ROWWISE_ADAGRAD, v1::ADAM}) {
      auto table = EmbeddingTable::Create(Config(type, dtype)).value();
      const int64_t payload = EmbeddingTable::StoredRowBytes(table->config()) - 8;
      constexpr int64_t kRows = 300000;
      std::vector<int64_t> ids(kRows);
      for (int64_t i = 0; i < kRows; ++i) ids[i] = i * 7919;
      std::vector<float> out(kRows * 16);
      ASSERT_TRUE(table->Lookup(ids, out.data()).ok());
      const double per_row = static_cast<double>(table->MemoryBytes()) / kRows;
      EXPECT_LE(per_row, 1.25 * static_cast<double>(payload) + 16)
          << v1::OptimizerType_Name(type) << " " << v1::Dtype_Name(dtype);
      EXPECT_GE(per_row, static_cast<double>(payload) + 8 + 12);
    }
  }
}

}  // namespace
}  // namespace tessera::embedding
