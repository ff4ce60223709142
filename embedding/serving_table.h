#ifndef TESSERA_EMBEDDING_SERVING_TABLE_H_
#define TESSERA_EMBEDDING_SERVING_TABLE_H_

// A table's rows as a serving replica holds them: read by lookups, changed only by the
// trained rows the replica is sent (Apply), and stored as trained (fp32), in half precision
// (fp16) or row-wise int8: each row's dim bytes q, then its scale and bias as fp32, so that
// an element reads scale * q + bias (FBGEMM's inference tables store rows the same way).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "tessera/v1/config.pb.h"

namespace tessera::embedding_internal {
class RowInitializer;
}

namespace tessera::embedding {

enum class ServingFormat { kFp32, kFp16, kInt8 };

// "fp32", "fp16" or "int8"; InvalidArgument naming the choices otherwise.
absl::StatusOr<ServingFormat> ParseServingFormat(absl::string_view name);
std::string ServingFormatName(ServingFormat format);

// Bytes a row of `dim` takes in `format`: 4 dim, 2 dim, or dim + 8.
size_t ServingRowBytes(ServingFormat format, int dim);

// Encodes `row` (dim finite floats) into `out` (ServingRowBytes bytes): fp16 to nearest
// (saturating at +-65504); int8 with scale (max - min) / 255 and bias min, each element
// rounded to the nearest of the 256 levels.
void EncodeServingRow(ServingFormat format, const float* row, int dim, uint8_t* out);
// The dim floats an encoded row reads as.
void DecodeServingRow(ServingFormat format, const uint8_t* in, int dim, float* out);

// The most an element of `row` may move when encoded and decoded in `format`: 0 for fp32;
// for fp16 half a unit in the last place of the largest element (2^-11 of it, 2^-25 below
// fp16's normal range) or what saturation takes off; for int8 half a level,
// (max - min) / 510, and float rounding of scale * q + bias.
float ServingRowErrorBound(ServingFormat format, const float* row, int dim);

// One table of a serving replica. Ids never sent read as their initial weights, as a
// read-only lookup of the training table answers them. Thread-safe: lookups run together,
// and beside Apply.
class ServingTable {
 public:
  // InvalidArgument for a config without a name or a dim in [1, 65536].
  static absl::StatusOr<std::unique_ptr<ServingTable>> Create(const v1::TableConfig& config,
                                                              ServingFormat format);
  ~ServingTable();

  // Sets the rows of `ids` to `weights` (ids x dim, as trained; a repeated id takes its
  // last row). InvalidArgument, with nothing changed, for a wrong size, a value that is not
  // finite or an id outside a fixed vocabulary.
  absl::Status Apply(absl::Span<const int64_t> ids, absl::Span<const float> weights);
  // Sets the rows of `ids` back to their initial weights (the training side no longer
  // stores them: a shard restarted from an older checkpoint). InvalidArgument, with
  // nothing changed, for an id outside a fixed vocabulary.
  absl::Status ResetRows(absl::Span<const int64_t> ids);
  // Every id sent, in no particular order.
  std::vector<int64_t> Ids() const;
  // Bytes of one stored record: the id (8 bytes, little-endian), then the encoded row.
  size_t record_bytes() const { return record_bytes_; }
  // Hands `sink` every stored record, `count` at a time, contiguous (a replica saving its
  // rows); Apply waits meanwhile, lookups do not. Stops at the first error of `sink`.
  absl::Status ForEachRecords(
      const std::function<absl::Status(const uint8_t* records, int64_t count)>& sink) const;
  // Stores `count` records as ForEachRecords gave them (an id already held takes the
  // record's row). InvalidArgument, with nothing changed, for an id outside a fixed
  // vocabulary.
  absl::Status LoadRecords(const uint8_t* records, int64_t count);
  // The rows of `ids` (ids x dim) into `out`; InvalidArgument for a wrong size or an id
  // outside a fixed vocabulary.
  absl::Status Lookup(absl::Span<const int64_t> ids, absl::Span<float> out) const;

  const v1::TableConfig& config() const { return config_; }
  int dim() const { return config_.dim(); }
  ServingFormat format() const { return format_; }
  // Rows sent (distinct ids).
  int64_t rows() const;
  // Bytes the rows and their index take: allocated, not only used.
  int64_t memory_bytes() const;

 private:
  static constexpr uint32_t kEmpty = 0xffffffffu;
  static constexpr int64_t kBlockRows = 1 << 14;  // rows per block of the arena

  ServingTable(const v1::TableConfig& config, ServingFormat format);
  absl::Status CheckIds(absl::Span<const int64_t> ids) const;
  // The row slot of `id`, or kEmpty.
  uint32_t Find(int64_t id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The slot of `id`, made (uninitialized) when it has none.
  uint32_t FindOrAdd(int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void GrowIndex() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Slot `slot`'s record: its id (8 bytes), then the encoded row.
  uint8_t* Record(uint32_t slot) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const v1::TableConfig config_;
  const ServingFormat format_;
  const size_t record_bytes_;
  std::unique_ptr<embedding_internal::RowInitializer> initializer_;
  mutable absl::Mutex mu_;
  // Open addressing, linear probing: slots by the id's hash, at most 3/4 full.
  std::vector<uint32_t> index_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<uint8_t[]>> blocks_ ABSL_GUARDED_BY(mu_);
  uint32_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera::embedding

#endif  // TESSERA_EMBEDDING_SERVING_TABLE_H_
