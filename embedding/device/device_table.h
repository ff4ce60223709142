#ifndef TESSERA_EMBEDDING_DEVICE_DEVICE_TABLE_H_
#define TESSERA_EMBEDDING_DEVICE_DEVICE_TABLE_H_

// An embedding table in a GPU's memory: the same rows, initial weights, optimizers and
// dtypes as EmbeddingTable, with lookups, pooling, deduplication (CUB), the pooling's
// backward and the optimizer steps run as kernels (device_table_kernels.cu) over
// table_core.h, the per-thread code the CPU tests check against the host table.
//
// In a build without CUDA (TESSERA_CUDA=OFF, or AUTO where nvcc was not found) Create
// and Usable say so (FAILED_PRECONDITION) and name what is missing.
//
// Calls take and give host memory and return when the device is done; one call at a
// time per table (callers serialise: the trainer's sparse step does).

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "embedding/embedding_table.h"
#include "tessera/v1/config.pb.h"

namespace tessera::embedding::device {

class DeviceTable {
 public:
  // OK when this build has device tables and CUDA device `device` can be used.
  static absl::Status Usable(int device);

  // A table for `config` (its placement is not looked at) on device `device`, holding up
  // to its max_rows rows (table_layout.h's default when unset): InvalidArgument for a
  // config a device table cannot hold, ResourceExhausted when the device lacks the
  // memory, FailedPrecondition without CUDA.
  static absl::StatusOr<std::unique_ptr<DeviceTable>> Create(const v1::TableConfig& config,
                                                             int device);

  virtual ~DeviceTable() = default;

  virtual const v1::TableConfig& config() const = 0;
  virtual int64_t num_rows() const = 0;
  virtual int64_t max_rows() const = 0;
  // Bytes of device memory the table's arrays take.
  virtual int64_t MemoryBytes() const = 0;

  // With `offsets` empty, the rows of `ids` into out (ids.size(), dim); else the bags
  // offsets describes (CSR, bags + 1 entries), each pooled (SUM or MEAN, optionally
  // weighted) into out (bags, dim). Missing rows are created when insert_missing (a full
  // table: ResourceExhausted, nothing created) and answer their initial weights either
  // way. Shapes are checked as a host collection checks them.
  virtual absl::Status Lookup(absl::Span<const int64_t> ids, absl::Span<const int32_t> offsets,
                              absl::Span<const float> weights, v1::Pooling pooling, float* out,
                              bool insert_missing) = 0;

  // One optimizer step of each row of `ids` (distinct) with its summed gradient (ids, dim).
  // Gradients must be finite (InvalidArgument otherwise, nothing applied); a row whose
  // step would overflow keeps its values and the call says so (PartlyApplied).
  virtual absl::Status ApplyUniqueGradients(absl::Span<const int64_t> ids, const float* grads,
                                            int64_t step) = 0;

  // The whole sparse step's way back, on the device: the gradients of pooled bags
  // (bags, dim), as Lookup pooled them from `ids`, `offsets` and `weights`, taken back to
  // each distinct id (summed in the ids' order, as the host's PoolBagsBackward sums) and
  // applied as ApplyUniqueGradients does.
  virtual absl::Status ApplyPooledGradients(absl::Span<const int64_t> ids,
                                            absl::Span<const int32_t> offsets,
                                            absl::Span<const float> weights, v1::Pooling pooling,
                                            const float* bag_grads, int64_t step) = 0;

  // Every row, copied to the host in chunks: weights widened to floats, state, counters
  // (what checkpoints and export write, as for a host table).
  virtual absl::Status ForEachRow(const EmbeddingTable::RowFn& fn) const = 0;

  // Stores rows as given (weights (ids, dim), state (ids, state floats), metas), over
  // rows the ids have; ResourceExhausted when they would pass max_rows (nothing stored).
  virtual absl::Status PutRows(absl::Span<const int64_t> ids, const float* weights,
                               const float* state, absl::Span<const RowMeta> metas) = 0;
};

}  // namespace tessera::embedding::device

#endif  // TESSERA_EMBEDDING_DEVICE_DEVICE_TABLE_H_
