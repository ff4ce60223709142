#include "embedding/storage/internal/store_spill.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "embedding/storage/row_codec.h"

namespace tessera::storage_internal {

using storage::DecodedRow;
using storage::DecodeRow;
using storage::EncodeRow;
using storage::KvWrite;
using storage::RowKey;
using storage::SpillKey;

absl::Status StoreSpill::Evict(int64_t id, const float* weights, const float* state,
                              const embedding::RowMeta& meta, bool dirty) {
  if (!dirty) return absl::OkStatus();  // the store has it, or it is still initial
  KvWrite w;
  // Write-through rows belong in the durable rows; checkpoint rows changed since the
  // checkpoint must not be, until the next one.
  w.key = write_through_ ? RowKey(table_id_, id) : SpillKey(table_id_, id);
  EncodeRow(weights, dim_, state, state_floats_, meta, &w.value);
  return Annotate(store_->Write({w}, /*sync=*/false),
                  absl::StrCat("table '", name_, "': evicting row ", id));
}

absl::StatusOr<bool> StoreSpill::Fetch(int64_t id, float* weights, float* state,
                                       embedding::RowMeta* meta, bool* dirty) {
  std::optional<std::string> value;
  *dirty = false;
  if (!write_through_) {
    TESSERA_ASSIGN_OR_RETURN(value, store_->Get(SpillKey(table_id_, id)));
    *dirty = value.has_value();
  }
  if (!value.has_value()) {
    TESSERA_ASSIGN_OR_RETURN(value, store_->Get(RowKey(table_id_, id)));
  }
  if (!value.has_value()) return false;
  DecodedRow row;
  TESSERA_RETURN_IF_ERROR(DecodeRow(name_, id, *value, dim_, state_floats_, &row));
  std::copy(row.weights.begin(), row.weights.end(), weights);
  std::copy(row.state.begin(), row.state.end(), state);
  *meta = row.meta;
  return true;
}

void StoreSpill::Drop(int64_t id) {
  const absl::Status erased = store_->Write({KvWrite{RowKey(table_id_, id), "", /*erase=*/true},
                                             KvWrite{SpillKey(table_id_, id), "", /*erase=*/true}},
                                            /*sync=*/false);
  // The row is gone from memory either way; a copy left in the store comes back as the
  // row's value when the id is next read (or the table is loaded again).
  if (!erased.ok()) {
    std::fprintf(stderr, "tessera: table '%s': row %lld expired but stays in the store: %s\n",
                 name_.c_str(), static_cast<long long>(id), erased.ToString().c_str());
  }
}

}  // namespace tessera::storage_internal
