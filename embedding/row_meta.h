#ifndef TESSERA_EMBEDDING_ROW_META_H_
#define TESSERA_EMBEDDING_ROW_META_H_

#include <cstdint>

namespace tessera::embedding {

// Per-row bookkeeping kept next to the row (used by eviction and persistence).
struct RowMeta {
  int64_t last_step = -1;    // step of the last applied update, -1 if never updated
  int64_t update_count = 0;  // optimizer steps applied to this row (Adam's t)
};

}  // namespace tessera::embedding

#endif  // TESSERA_EMBEDDING_ROW_META_H_
