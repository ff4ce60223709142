#include "embedding/device/table_layout.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "embedding/dtype.h"
#include "embedding/embedding_table.h"
#include "embedding/internal/row_initializer.h"
#include "embedding/optimizer.h"

namespace tessera::embedding::device {
namespace {

StoredDtype StoredOf(v1::Dtype dtype) {
  switch (dtype) {
    case v1::FP16:
      return StoredDtype::kFp16;
    case v1::BF16:
      return StoredDtype::kBf16;
    default:
      return StoredDtype::kFp32;
  }
}

}  // namespace

absl::StatusOr<TableLayout> DescribeTable(const v1::TableConfig& config) {
  TESSERA_RETURN_IF_ERROR(ValidateTableConfig(config));
  const std::string where = absl::StrCat("table '", config.name(), "' on the device");
  if (config.dim() > kMaxDeviceDim) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": dim ", config.dim(),
                                                   " is above the device table's ", kMaxDeviceDim,
                                                   "; keep the table on the host"));
  }
  if (config.eviction().policy() != v1::EVICTION_NONE || config.eviction().ttl_steps() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     ": eviction and ttl_steps need host tables; a device table keeps every row up "
                     "to max_rows"));
  }
  if (config.vocabulary_size() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": a fixed vocabulary needs a host table"));
  }
  if (config.admission().min_count() > 1 ||
      (config.admission().probability() > 0.0f && config.admission().probability() < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": admission needs a host table; a device table makes a row for every id"));
  }
  absl::StatusOr<OptimizerParams> params = ResolveOptimizer(config.optimizer());
  if (!params.ok()) return params.status();
  TableLayout layout;
  layout.max_rows = config.max_rows() > 0 ? config.max_rows() : kDefaultDeviceRows;
  TableView& v = layout.view;
  v.slots = static_cast<uint64_t>(std::ceil(static_cast<double>(layout.max_rows) / kMaxLoad));
  v.dim = config.dim();
  v.dtype = StoredOf(config.dtype());
  v.optimizer = KindOf(params->type);
  v.state_floats = row_math::StateFloatsOf(v.optimizer, v.dim);
  v.hyper = HyperOf(*params);
  v.initial_accumulator = params->initial_accumulator;
  // The host table's initializer: the same key and scale, so rows start the same.
  const embedding_internal::RowInitializer init(config);
  v.init_key = init.key();
  v.init_scale = init.scale();
  switch (config.initializer().type()) {
    case v1::NORMAL:
      v.init_type = 1;
      break;
    case v1::ZEROS:
      v.init_type = 2;
      break;
    default:
      v.init_type = 0;
  }
  layout.weight_bytes = DtypeBytes(config.dtype());
  return layout;
}

}  // namespace tessera::embedding::device
