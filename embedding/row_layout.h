#ifndef TESSERA_EMBEDDING_ROW_LAYOUT_H_
#define TESSERA_EMBEDDING_ROW_LAYOUT_H_

// Where a row's parts sit: [weights (in the table's dtype) | optimizer state (fp32) |
// StoredMeta], padded to a multiple of 64 bytes. fp32 weights and state are contiguous,
// so one copy saves both before an update. Public: what a row costs in memory is part of
// a table's contract (benchmarks and capacity plans size tables by RowLayout::stride_floats).

#include <cstdint>

#include "embedding/row_meta.h"

namespace tessera::embedding {

// What sits after a row's optimizer state: the public RowMeta and a dirty flag.
struct StoredMeta {
  RowMeta meta;
  uint32_t dirty = 0;  // 0: clean; else 1 + the row's place in its stripe's dirty list
};

struct RowLayout {
  // `weight_floats`: floats the stored weights take (dim, or dim / 2 rounded up for
  // half-precision tables); `state_floats`: the optimizer's state per row.
  RowLayout(int weight_floats, int state_floats)
      : weight_floats(weight_floats),
        state_floats(state_floats),
        // Meta is 8-byte aligned: at an even float offset.
        meta_at((weight_floats + state_floats + 1) / 2 * 2),
        stride_floats((meta_at + kMetaFloats + 15) / 16 * 16),
        read_lines((weight_floats * 4 + 63) / 64),
        lines(stride_floats / 16) {}

  static constexpr int kMetaFloats = sizeof(StoredMeta) / sizeof(float);

  int weight_floats;
  int state_floats;
  int meta_at;        // floats before the row's StoredMeta
  int stride_floats;  // a multiple of 16 floats (64 bytes)
  int read_lines;     // cache lines a lookup reads: the weights
  int lines;          // cache lines of the whole row

  float* StateOf(float* row) const { return row + weight_floats; }
  const float* StateOf(const float* row) const { return row + weight_floats; }
  StoredMeta* MetaOf(float* row) const { return reinterpret_cast<StoredMeta*>(row + meta_at); }
  const StoredMeta* MetaOf(const float* row) const {
    return reinterpret_cast<const StoredMeta*>(row + meta_at);
  }
};

}  // namespace tessera::embedding

#endif  // TESSERA_EMBEDDING_ROW_LAYOUT_H_
