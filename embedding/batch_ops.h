#ifndef TESSERA_EMBEDDING_BATCH_OPS_H_
#define TESSERA_EMBEDDING_BATCH_OPS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "embedding/collection.h"
#include "embedding/row_math.h"
#include "tessera/v1/config.pb.h"

namespace tessera::embedding {

// row_math's name for a pooling (SUM for POOLING_UNSPECIFIED and unknown values).
row_math::PoolingKind PoolingKindOf(v1::Pooling pooling);

// Deduplicates `ids`: `unique_ids` gets each distinct id once, in order of first
// appearance, and `inverse` (ids.size()) the position of each id in `unique_ids`, so
// ids[i] == unique_ids[inverse[i]]. Reuses a per-thread hash table between calls.
void Unique(absl::Span<const int64_t> ids, std::vector<int64_t>* unique_ids,
            std::vector<int32_t>* inverse);

// A 64-bit digest of `ids`, their order included: two lists that differ give the same
// one with a chance of about 2^-64. One pass, about a nanosecond an id.
uint64_t IdsFingerprint(absl::Span<const int64_t> ids);

// out[inverse[i]] += rows[i] for each i, in order of i: rows (inverse.size(), dim),
// out (max(inverse)+1, dim), already initialised by the caller.
void SumRowsByInverse(const float* rows, int dim, absl::Span<const int32_t> inverse, float* out);

// OK when `values` holds `rows` x `dim` floats; otherwise InvalidArgument
// "table 'T': dimension mismatch: WHAT has N floats, expected ... (ROWS UNIT x dim D)".
absl::Status CheckRowsSize(absl::string_view table, absl::string_view what, size_t size,
                           size_t rows, int dim, absl::string_view unit);

// OK when every gradient (ids.size(), dim) is finite; otherwise InvalidArgument naming the
// first bad id, its position and column, so the caller can reject the batch whole.
absl::Status CheckFiniteGradients(absl::string_view table, absl::Span<const int64_t> ids,
                                  const float* gradients, int dim);

// A push's parts checked where they entered this process (CheckPush): part i's gradients
// are ids x dim floats of configs()[i]'s table, and every one is finite. The layers
// beneath (a shard router, a shard's collection) take it and scan the values no more: only
// the sums of repeated ids, which finite gradients can overflow, are checked where they
// are made. Only CheckPush makes one. A view: the configs and parts it was made from must
// outlive it, unchanged.
class CheckedPush {
 public:
  CheckedPush() = default;  // no parts
  absl::Span<const v1::TableConfig> configs() const { return configs_; }
  absl::Span<const TableGradients> parts() const { return parts_; }
  size_t size() const { return parts_.size(); }

 private:
  friend absl::StatusOr<CheckedPush> CheckPush(absl::Span<const v1::TableConfig> configs,
                                               absl::Span<const TableGradients> parts);
  CheckedPush(absl::Span<const v1::TableConfig> configs, absl::Span<const TableGradients> parts)
      : configs_(configs), parts_(parts) {}
  absl::Span<const v1::TableConfig> configs_;
  absl::Span<const TableGradients> parts_;
};

// The one scan of a push's values in a process, where it enters (a client's call, a
// server's request): checks part i against configs[i] (the same number of each), its
// gradients ids x dim floats (CheckRowsSize) and every one finite (CheckFiniteGradients).
absl::StatusOr<CheckedPush> CheckPush(absl::Span<const v1::TableConfig> configs,
                                      absl::Span<const TableGradients> parts);

// Whether gradients given to SumGradients were checked at the process's edge (a part of a
// CheckedPush): then only the sums of repeated ids are checked, and no size.
enum class Gradients { kUnchecked, kChecked };

// A push's gradients for one table, deduplicated and summed per id, every sum finite: the
// form a table's update takes. The layers beneath (a collection's shards, the table) take
// it as it is and only TESSERA_DCHECK it. Sums finite imply every gradient was (Inf and NaN
// survive addition), so checking the sums checks the batch; the raw gradients are searched
// only to name a culprit. Not thread-safe; reused between calls, its buffers do not
// allocate once grown.
class SummedGradients {
 public:
  absl::Span<const int64_t> ids() const { return ids_; }  // distinct, in first-seen order
  const float* rows() const { return rows_.data(); }      // (ids().size(), dim())
  int dim() const { return dim_; }
  size_t size() const { return ids_.size(); }

 private:
  friend absl::Status SumGradients(absl::string_view table, absl::Span<const int64_t> ids,
                                   absl::Span<const float> gradients, int dim, SummedGradients* out,
                                   Gradients given);
  std::vector<int64_t> ids_;
  std::vector<int32_t> inverse_;
  std::vector<float> rows_;
  int dim_ = 0;
};

// Fills `out` with `gradients` (ids.size(), dim) summed per distinct id of `ids`, in batch
// order. InvalidArgument when the gradients are not ids x dim floats (CheckRowsSize) or a
// sum is not finite: CheckFiniteGradients' words for the first bad gradient sent, or, when
// every one was finite, for the first bad sum, "summed over repeated ids". Gradients
// kChecked (a CheckedPush's part) are taken as they are: of them, only sums of repeated ids
// are checked.
absl::Status SumGradients(absl::string_view table, absl::Span<const int64_t> ids,
                          absl::Span<const float> gradients, int dim, SummedGradients* out,
                          Gradients given = Gradients::kUnchecked);

// OK when every pooling weight is finite; otherwise InvalidArgument "WHERE: weight I is V".
absl::Status CheckFiniteWeights(absl::string_view where, absl::Span<const float> weights);

// Checks CSR bag offsets over `num_ids` ids: offsets has bags+1 entries, starts at 0,
// never decreases and ends at num_ids; `num_weights` is 0 (unweighted) or num_ids.
// InvalidArgument says which rule broke and where.
absl::Status ValidateBags(size_t num_ids, absl::Span<const int32_t> offsets, size_t num_weights);

// Checks the shape of one table's part of a lookup: with bag offsets, ValidateBags and
// finite weights; without, no weights (they need offsets). Returns the rows of its answer:
// bags, or ids without offsets. InvalidArgument prefixed with `where` ("table 'T'").
absl::StatusOr<size_t> CheckLookupShape(absl::string_view where, size_t num_ids,
                                        absl::Span<const int32_t> offsets,
                                        absl::Span<const float> weights);

// Pools the rows of each bag. `rows` (unique, dim) holds the row of each distinct id and
// `inverse` (ids) maps every id of the batch to its row; bag b covers ids
// [offsets[b], offsets[b+1]). SUM adds weight * row (weight 1 when `weights` is empty);
// MEAN divides that sum by the bag's id count (multiplies by its reciprocal), SQRTN by
// its square root (row_math::BagScale). An empty bag pools to zeros.
// out: (bags, dim). Offsets must have passed ValidateBags.
void PoolBags(const float* rows, int dim, absl::Span<const int32_t> inverse,
              absl::Span<const int32_t> offsets, absl::Span<const float> weights,
              v1::Pooling pooling, float* out);

// A lookup answered as distinct rows `rows` (n, dim) and each id's row in them
// (`row_of_ids`): copied into `out` (no offsets: one row per id) or pooled (PoolBags).
void RowsToAnswer(const float* rows, int dim, absl::Span<const int32_t> row_of_ids,
                  absl::Span<const int32_t> offsets, absl::Span<const float> weights,
                  v1::Pooling pooling, float* out);

// A lookup of bags whose shards each pooled (SUM) their share of every bag: the partial
// sums (`partials`, each (bags, dim) fp32, in any alignment) added into `out` in the order
// given, then each bag scaled over its whole size as `pooling` says. The router and a
// client merging a coordinator's forwarded answer both merge this way: the same floats
// added in the same order.
void AddPartialBags(absl::Span<const char* const> partials, int dim,
                    absl::Span<const int32_t> offsets, v1::Pooling pooling, float* out);

// The backward of PoolBags: given the gradient of each pooled bag (bags, dim), writes
// the gradient of each distinct row, summed over every place it was pooled, into
// `unique_grads` (num_unique, dim), which this function zeroes first.
void PoolBagsBackward(const float* bag_grads, int dim, absl::Span<const int32_t> inverse,
                      absl::Span<const int32_t> offsets, absl::Span<const float> weights,
                      v1::Pooling pooling, size_t num_unique, float* unique_grads);

// InvalidArgument unless `rows` fits table `table` (`dim`, `state_floats` per row): dim
// matches, weights are (ids, dim), state empty or (ids, state_floats), steps and counts
// empty or one per id, every value finite.
absl::Status CheckRowBlock(absl::string_view table, int dim, int state_floats,
                           const RowBlock& rows);

}  // namespace tessera::embedding

#endif  // TESSERA_EMBEDDING_BATCH_OPS_H_
