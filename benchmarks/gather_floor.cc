// tessera-gather-floor: what this machine's memory gives a gather of random 64-byte rows
// (dim 16, fp32) of a table far larger than the cache, in bare loops without a table's
// checks, so that a dynamic table's gather can be set against its design's floor:
//
//   flat            rows addressed by id, huge pages, prefetched 16 ids ahead
//   bucket, row     one map bucket (a cache line of 5 hash/row entries) read for each id,
//                   then its row: two dependent misses an id, one pass in batch order
//   table's shape   the same in EmbeddingTable's shape: 64 stripe maps, a batch's ids
//                   grouped by stripe, found 64 at a time (buckets prefetched 8 ahead, rows
//                   on finding) and then copied
//   ... beside torch  the table's shape taking turns batch by batch with a flat gather over
//                   rows in small pages, as a PyTorch tensor holds them (the pair
//                   benchmarks/gather_vs_torch.py measures)
//   the table       EmbeddingTable's own gather (a dynamic dim-16 table of as many rows),
//                   taking turns with the same flat gather over small pages (--table)
//
//   ./build/tessera-gather-floor [--rows_gib=2.5] [--batches=256] [--table=false]
//
// Every id is in its first bucket here; a table's map also sends some to a second one.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/types/span.h"
#include "embedding/embedding_table.h"
#include "tessera/v1/config.pb.h"

ABSL_FLAG(double, rows_gib, 2.5, "GiB of rows of each table (the map adds about a quarter)");
ABSL_FLAG(int, batches, 256, "batches of 4,096 ids a measurement (best of 3 passes)");
ABSL_FLAG(double, second, 0.3,
          "share of ids in their second bucket in the last case (a table's map at its load "
          "limit holds 20-30% so)");

ABSL_FLAG(bool, table, true,
          "also EmbeddingTable's own gather (its rows are stored first: about a minute at "
          "2.5 GiB)");

namespace {

constexpr int kBatch = 4096;
constexpr int kDim = 16;
constexpr int kRowBytes = kDim * 4;
constexpr int kStripes = 64;
constexpr int kStripeShift = 58;
constexpr int kChunk = 64;
constexpr int kProbeAhead = 8;
constexpr int kGatherAhead = 16;
constexpr uint32_t kNone = 0xffffffffu;

struct __attribute__((packed)) Entry {
  uint64_t hash;
  uint32_t row;
};
struct alignas(64) Bucket {
  Entry slot[5];
  uint32_t overflow;
};

// `bytes` of memory, written once; in huge pages or (`huge` false) small ones.
char* Memory(size_t bytes, bool huge) {
  constexpr size_t kHuge = size_t{2} << 20;
  void* raw =
      mmap(nullptr, bytes + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  char* p = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + kHuge - 1) & ~(kHuge - 1));
  madvise(p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  std::memset(p, 1, bytes);
  return p;
}

void Prefetch(const void* p, int hint_l2) {
  if (hint_l2) {
    __builtin_prefetch(p, 0, 2);
  } else {
    __builtin_prefetch(p, 0, 3);
  }
}

uint64_t BucketOf(uint64_t h, uint64_t buckets) { return ((h & 0xffffffffu) * buckets) >> 32; }

// The row of hash `h` in bucket `b`, or `absent`.
uint32_t Find(const Bucket& b, uint64_t h, uint32_t absent = 0) {
  uint32_t row = absent;
  for (const Entry& e : b.slot) row = e.hash == h ? e.row : row;
  return row;
}

// A table: rows, and a map of 64 stripes in which every id of `hashes` is in its bucket.
struct Table {
  uint64_t rows = 0;
  uint64_t buckets = 0;  // a stripe's
  char* weights = nullptr;
  std::vector<Bucket*> maps;
  std::vector<uint64_t> hashes;  // batches of ids, as hashes

  // `second`: the share of ids put in their second bucket (SecondBucket), their first
  // bucket's overflow bit set.
  Table(uint64_t n, int batches, double second, std::mt19937_64& rng)
      : rows(n), buckets(n / 4 / kStripes) {
    weights = Memory(rows * kRowBytes, true);
    for (int s = 0; s < kStripes; ++s) {
      maps.push_back(reinterpret_cast<Bucket*>(Memory(buckets * sizeof(Bucket), true)));
      for (uint64_t b = 0; b < buckets; ++b) {
        for (Entry& e : maps[s][b].slot) e = Entry{0, static_cast<uint32_t>(rng() % rows)};
        maps[s][b].overflow = 0;
      }
    }
    hashes.resize(static_cast<size_t>(batches) * kBatch);
    for (uint64_t& h : hashes) {
      h = rng();
      Bucket* map = maps[h >> kStripeShift];
      const bool away = static_cast<double>(rng() % 1000) < second * 1000;
      if (away) map[BucketOf(h, buckets)].overflow |= 1u << ((h >> 40) & 31);
      map[away ? SecondOf(h) : BucketOf(h, buckets)].slot[rng() % 4].hash = h;
    }
  }
  ~Table() {
    munmap(weights, rows * kRowBytes);
    for (Bucket* map : maps) munmap(map, buckets * sizeof(Bucket));
  }
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;
  uint64_t SecondOf(uint64_t h) const {
    const uint64_t b = BucketOf(h >> 26, buckets);
    return b != BucketOf(h, buckets) ? b : (b + 1) % buckets;
  }
  // An id's first bucket: true with *row when it settles the lookup, false when the
  // overflow bit sends it to its second.
  bool InFirst(uint64_t h, uint32_t* row) const {
    const Bucket& b = BucketFor(h);
    *row = Find(b, h, kNone);
    if (*row != kNone) return true;
    *row = 0;  // an id whose slot a later one took (rare): row 0 stands in
    return (b.overflow & (1u << ((h >> 40) & 31))) == 0;
  }
  const Bucket& SecondFor(uint64_t h) const { return maps[h >> kStripeShift][SecondOf(h)]; }
  const Bucket& BucketFor(uint64_t h) const {
    return maps[h >> kStripeShift][BucketOf(h, buckets)];
  }
  const char* Row(uint32_t r) const { return weights + static_cast<size_t>(r) * kRowBytes; }
};

// Batch `b`: one bucket then its row an id, in batch order.
void BucketThenRow(const Table& t, int b, float* out) {
  const uint64_t* h = &t.hashes[static_cast<size_t>(b) * kBatch];
  static uint32_t row[kBatch];
  for (int i = 0; i < kBatch + 2 * kGatherAhead; ++i) {
    if (i < kBatch) Prefetch(&t.BucketFor(h[i]), 0);
    if (const int k = i - kGatherAhead; k >= 0 && k < kBatch) {
      row[k] = Find(t.BucketFor(h[k]), h[k]);
      Prefetch(t.Row(row[k]), 1);
    }
    if (const int c = i - 2 * kGatherAhead; c >= 0) {
      std::memcpy(out + c * kDim, t.Row(row[c]), kRowBytes);
    }
  }
}

// The positions of a batch's hashes `h` grouped by stripe into `order` (a counting sort).
void GroupByStripe(const uint64_t* h, int* order) {
  int begin[kStripes + 1] = {};
  for (int i = 0; i < kBatch; ++i) ++begin[(h[i] >> kStripeShift) + 1];
  for (int s = 0; s < kStripes; ++s) begin[s + 1] += begin[s];
  for (int i = 0; i < kBatch; ++i) order[begin[h[i] >> kStripeShift]++] = i;
}

// Batch `b` in the table's shape: grouped by stripe, found and copied 64 at a time. An id
// its first bucket does not settle has its second prefetched and is looked up after the
// chunk's others (EmbeddingTable's FindGroup).
void TableShape(const Table& t, int b, float* out) {
  const uint64_t* h = &t.hashes[static_cast<size_t>(b) * kBatch];
  static int order[kBatch];
  static uint32_t row[kBatch];
  GroupByStripe(h, order);
  for (int c = 0; c < kBatch; c += kChunk) {
    const int end = std::min(kBatch, c + kChunk);
    int deferred[kChunk], num_deferred = 0;
    for (int j = c; j < end + kProbeAhead; ++j) {
      if (j < end) Prefetch(&t.BucketFor(h[order[j]]), 0);
      if (const int k = j - kProbeAhead; k >= c) {
        if (t.InFirst(h[order[k]], &row[k])) {
          Prefetch(t.Row(row[k]), 1);
        } else {
          Prefetch(&t.SecondFor(h[order[k]]), 0);
          deferred[num_deferred++] = k;
        }
      }
    }
    for (int d = 0; d < num_deferred; ++d) {
      const int k = deferred[d];
      row[k] = Find(t.SecondFor(h[order[k]]), h[order[k]]);
      Prefetch(t.Row(row[k]), 1);
    }
    for (int j = end; j < std::min(kBatch, end + kProbeAhead); ++j) {
      Prefetch(&t.BucketFor(h[order[j]]), 0);
    }
    for (int k = c; k < end; ++k) std::memcpy(out + order[k] * kDim, t.Row(row[k]), kRowBytes);
  }
}

// A flat gather of batch `b` of `ids` from `rows`.
void Flat(const char* rows, const std::vector<uint32_t>& ids, int b, float* out) {
  const uint32_t* id = &ids[static_cast<size_t>(b) * kBatch];
  for (int i = 0; i < kBatch; ++i) {
    if (i + kGatherAhead < kBatch) Prefetch(rows + size_t{id[i + kGatherAhead]} * kRowBytes, 0);
    std::memcpy(out + i * kDim, rows + size_t{id[i]} * kRowBytes, kRowBytes);
  }
}

using Clock = std::chrono::steady_clock;

// Ids a second of `first` over the best of 3 passes of `batches` batches, with `second`
// (when given) run between them batch by batch and timed apart: {first's, second's}.
std::pair<double, double> Rate(int batches, const std::function<void(int)>& first,
                               const std::function<void(int)>& second = nullptr) {
  double best_first = 1e30, best_second = 1e30;
  for (int pass = 0; pass < 3; ++pass) {
    double a = 0, b = 0;
    for (int i = 0; i < batches; ++i) {
      if (second) {
        const auto t0 = Clock::now();
        second(i);
        b += std::chrono::duration<double>(Clock::now() - t0).count();
      }
      const auto t0 = Clock::now();
      first(i);
      a += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    best_first = std::min(best_first, a);
    best_second = std::min(best_second, b);
  }
  const double ids = static_cast<double>(batches) * kBatch;
  return {ids / best_first / 1e6, second ? ids / best_second / 1e6 : 0};
}

// EmbeddingTable's gather of batches of `ids` from a dynamic table of ids 0..rows-1,
// taking turns with a flat gather of the same ids over `small_pages`: {its M ids/s, the
// flat gather's}.
std::pair<double, double> RealTable(uint64_t rows, const std::vector<uint32_t>& ids, int batches,
                                    const char* small_pages) {
  tessera::v1::TableConfig config;
  config.set_name("floor");
  config.set_dim(kDim);
  config.mutable_optimizer()->set_type(tessera::v1::SGD);
  auto table = tessera::embedding::EmbeddingTable::Create(config);
  if (!table.ok()) {
    std::fprintf(stderr, "%s\n", table.status().ToString().c_str());
    std::exit(1);
  }
  std::vector<int64_t> fill(65536);
  std::vector<float> filled(fill.size() * kDim);
  for (uint64_t begin = 0; begin < rows; begin += fill.size()) {
    const size_t n = std::min<uint64_t>(fill.size(), rows - begin);
    for (size_t i = 0; i < n; ++i) fill[i] = static_cast<int64_t>(begin + i);
    if (absl::Status s = (*table)->Lookup(absl::MakeConstSpan(fill).first(n), filled.data());
        !s.ok()) {
      std::fprintf(stderr, "filling the table: %s\n", s.ToString().c_str());
      std::exit(1);
    }
  }
  const std::vector<int64_t> wide(ids.begin(), ids.end());
  std::vector<float> out(kBatch * kDim), other(kBatch * kDim);
  return Rate(
      batches,
      [&](int b) {
        const auto batch =
            absl::MakeConstSpan(wide).subspan(static_cast<size_t>(b) * kBatch, kBatch);
        (void)(*table)->Lookup(batch, out.data(), /*insert_missing=*/false);
      },
      [&](int b) { Flat(small_pages, ids, b, other.data()); });
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("A dim-16 gather's floor on this machine: ./tessera-gather-floor");
  absl::ParseCommandLine(argc, argv);
  const int batches = std::max(1, absl::GetFlag(FLAGS_batches));
  const auto rows = static_cast<uint64_t>(absl::GetFlag(FLAGS_rows_gib) * (1 << 30) / kRowBytes);
  std::mt19937_64 rng(1);
  std::printf("rows: %llu of %d bytes (%.2f GiB) a table; batches of %d random ids\n",
              static_cast<unsigned long long>(rows), kRowBytes,
              static_cast<double>(rows) * kRowBytes / (1 << 30), kBatch);
  std::vector<uint32_t> ids(static_cast<size_t>(batches) * kBatch);
  const char* small_pages = Memory(rows * kRowBytes, false);
  {
    const double second = absl::GetFlag(FLAGS_second);
    const Table table(rows, batches, 0, rng);
    const Table away(rows, batches, second, rng);
    for (uint32_t& id : ids) id = static_cast<uint32_t>(rng() % rows);
    std::vector<float> out(kBatch * kDim), other(kBatch * kDim);
    const double flat =
        Rate(batches, [&](int b) { Flat(table.weights, ids, b, out.data()); }).first;
    const double bucket = Rate(batches, [&](int b) { BucketThenRow(table, b, out.data()); }).first;
    const double shape = Rate(batches, [&](int b) { TableShape(table, b, out.data()); }).first;
    const auto [beside, torch] = Rate(
        batches, [&](int b) { TableShape(table, b, out.data()); },
        [&](int b) { Flat(small_pages, ids, b, other.data()); });
    std::printf("flat:                        %6.1f M ids/s\n", flat);
    std::printf("bucket, row:                 %6.1f M ids/s\n", bucket);
    std::printf("table's shape:               %6.1f M ids/s\n", shape);
    std::printf(
        "table's shape beside torch:  %6.1f M ids/s against %.1f M (flat, small pages): "
        "%.2fx\n",
        beside, torch, beside / torch);
    const auto [away_beside, away_torch] = Rate(
        batches, [&](int b) { TableShape(away, b, out.data()); },
        [&](int b) { Flat(small_pages, ids, b, other.data()); });
    std::printf("... %2.0f%% in a second bucket:   %6.1f M ids/s against %.1f M: %.2fx\n",
                100 * second, away_beside, away_torch, away_beside / away_torch);
  }
  if (absl::GetFlag(FLAGS_table)) {
    std::fflush(stdout);
    const auto [real, real_torch] = RealTable(rows, ids, batches, small_pages);
    std::printf("the table beside torch:      %6.1f M ids/s against %.1f M: %.2fx\n", real,
                real_torch, real / real_torch);
  }
  return 0;
}
