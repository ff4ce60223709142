#ifndef TESSERA_EMBEDDING_DEVICE_TABLE_LAYOUT_H_
#define TESSERA_EMBEDDING_DEVICE_TABLE_LAYOUT_H_

// How a device table of a given config is laid out: its slots, the bytes of each array,
// and the TableView fields that do not point into memory. Host C++, built everywhere:
// the CUDA table allocates from it, and the CPU tests of table_core.h do the same in
// host memory.

#include <cstdint>

#include "absl/status/statusor.h"
#include "embedding/device/table_core.h"
#include "tessera/v1/config.pb.h"

namespace tessera::embedding::device {

// Rows a device table holds when its config sets no max_rows.
inline constexpr int64_t kDefaultDeviceRows = int64_t{1} << 20;

// The widest row a device table holds (a kernel thread updates a row in local memory).
inline constexpr int kMaxDeviceDim = 256;

// The most a table's slots are filled: its rows' limit is at most this fraction of them.
inline constexpr double kMaxLoad = 0.75;

struct TableLayout {
  TableView view;        // every field but the pointers
  int64_t max_rows = 0;  // rows it may hold: a new row past it is RESOURCE_EXHAUSTED
  int weight_bytes = 0;  // bytes of one stored weight (4, or 2 for fp16 and bf16)
  // Bytes of each array, slots + 1 entries each (the last is id -1's).
  uint64_t key_bytes() const { return (view.slots + 1) * sizeof(uint64_t); }
  uint64_t weights_bytes() const { return (view.slots + 1) * view.dim * weight_bytes; }
  uint64_t state_bytes() const { return (view.slots + 1) * view.state_floats * sizeof(float); }
  uint64_t counter_bytes() const { return (view.slots + 1) * sizeof(int64_t); }
  uint64_t total_bytes() const {
    return key_bytes() + weights_bytes() + state_bytes() + 2 * counter_bytes();
  }
};

// The layout of `config`, holding max_rows rows or kDefaultDeviceRows; InvalidArgument
// for a config ValidateTableConfig refuses and for what a device table cannot hold: rows
// wider than kMaxDeviceDim, eviction or time-to-live (a device table keeps every row).
absl::StatusOr<TableLayout> DescribeTable(const v1::TableConfig& config);

}  // namespace tessera::embedding::device

#endif  // TESSERA_EMBEDDING_DEVICE_TABLE_LAYOUT_H_
