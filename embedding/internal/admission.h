#ifndef TESSERA_EMBEDDING_INTERNAL_ADMISSION_H_
#define TESSERA_EMBEDDING_INTERNAL_ADMISSION_H_

// Feature admission for one table (or one shard's part of it): which ids without a row
// may get one (TableConfig.admission).
//
// Counts: a count-min sketch, 4 rows of one-byte saturating counters, sliced by the
// table's stripes (each stripe counts its own ids in its own slice, under its writer
// lock), so counting needs no lock of its own and a batch counts the same whatever the
// thread count. Every count of an id adds one to its 4 counters; its count is their
// minimum, never lower than the pushes that carried it.
//
// Probability: a pure function of (table seed, id), so shards, processes and replays
// agree on every id.

#include <cstdint>
#include <memory>

#include "embedding/internal/aligned_block.h"
#include "tessera/v1/config.pb.h"

namespace tessera::embedding_internal {

class AdmissionFilter {
 public:
  static constexpr int kSketchRows = 4;
  static constexpr int kMaxMinCount = 255;
  static constexpr int64_t kDefaultSketchWidth = 65536;

  // The filter of `config`, or null when it admits every id (no admission, min_count <= 1
  // and probability 0 or 1). `config` has been validated. Null with `*out_of_memory` set
  // when the sketch cannot be allocated.
  static std::unique_ptr<AdmissionFilter> Create(const v1::TableConfig& config,
                                                 bool* out_of_memory);

  // Counts one more step that carried `id` (map hash `h`; its stripe's writer lock held)
  // and says whether the id may now have a row.
  bool Count(int64_t id, uint64_t h);
  // Whether Count(id, h) would admit `id` now; counts nothing (the stripe's lock held,
  // shared is enough).
  bool WouldAdmit(int64_t id, uint64_t h) const;
  // Whether `id` passes the probability test (always true without one).
  bool Coin(int64_t id) const;

  int min_count() const { return min_count_; }
  // Bytes of the sketch.
  int64_t bytes() const { return static_cast<int64_t>(counters_.bytes()); }

 private:
  AdmissionFilter(const v1::TableConfig& config, AlignedBlock counters, int64_t slice);
  // The place of `id`'s counter in sketch row `r` (hash `h`).
  int64_t Slot(uint64_t h, int r) const;
  int Estimate(uint64_t h) const;

  int min_count_;
  uint64_t seed_;
  bool coin_ = false;       // a probability below 1 applies
  uint64_t threshold_ = 0;  // admitted when the id's coin is below this
  AlignedBlock counters_;   // [stripe][sketch row][slice_] bytes
  int64_t slice_;           // counters per sketch row per stripe
};

}  // namespace tessera::embedding_internal

#endif  // TESSERA_EMBEDDING_INTERNAL_ADMISSION_H_
