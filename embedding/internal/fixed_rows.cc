// Fixed-vocabulary tables: FixedRows' arrays and the EmbeddingTable operations over them.

#include "embedding/internal/fixed_rows.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "embedding/dtype.h"
#include "embedding/embedding_table.h"
#include "embedding/internal/admission.h"
#include "embedding/internal/row_initializer.h"
#include "embedding/internal/row_ops.h"
#include "embedding/internal/stripe.h"
#include "embedding/internal/stripe_plan.h"
#include "embedding/row_math.h"

namespace tessera::embedding_internal {

std::unique_ptr<FixedRows> FixedRows::Create(int64_t vocabulary, int64_t part_index,
                                             int64_t part_count, int weight_floats,
                                             int state_floats, bool counts) {
  std::unique_ptr<FixedRows> f(new FixedRows);
  f->vocabulary_ = vocabulary;
  f->part_index_ = part_index;
  f->part_count_ = part_count;
  f->reciprocal_ = 1.0 / static_cast<double>(part_count);
  f->rows_ = vocabulary > part_index ? (vocabulary - part_index + part_count - 1) / part_count : 0;
  f->weight_floats_ = weight_floats;
  f->state_floats_ = state_floats;
  const size_t rows = static_cast<size_t>(std::max<int64_t>(f->rows_, 1));
  const size_t words = (rows + 63) / 64;
  f->weights_block_ = AlignedBlock(rows * weight_floats * sizeof(float));
  f->live_block_ = AlignedBlock(words * sizeof(uint64_t));
  f->dirty_block_ = AlignedBlock(words * sizeof(uint64_t));
  if (f->weights_block_.empty() || f->live_block_.empty() || f->dirty_block_.empty()) {
    return nullptr;
  }
  if (state_floats > 0) {
    f->state_block_ = AlignedBlock(rows * state_floats * sizeof(float));
    if (f->state_block_.empty()) return nullptr;
    f->state_ = static_cast<float*>(f->state_block_.data());
  }
  if (counts) {
    f->counts_block_ = AlignedBlock(rows * sizeof(uint32_t));
    if (f->counts_block_.empty()) return nullptr;
    f->counts_ = static_cast<uint32_t*>(f->counts_block_.data());
  }
  f->weights_ = static_cast<float*>(f->weights_block_.data());
  f->live_ = static_cast<uint64_t*>(f->live_block_.data());
  f->dirty_ = static_cast<uint64_t*>(f->dirty_block_.data());
  f->reserved_bytes_ = static_cast<int64_t>(f->weights_block_.bytes() + f->state_block_.bytes() +
                                            f->counts_block_.bytes() + f->live_block_.bytes() +
                                            f->dirty_block_.bytes());
  return f;
}

}  // namespace tessera::embedding_internal
