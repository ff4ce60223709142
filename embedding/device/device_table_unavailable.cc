// DeviceTable in a build without CUDA (TESSERA_CUDA=OFF, or AUTO where nvcc was not found):
// each entry point says so, and how to get a build that has it.

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "embedding/device/device_table.h"
#include "embedding/device/table_layout.h"

namespace tessera::embedding::device {
namespace {

absl::Status NotBuilt() {
  return NotBuiltWithoutCuda("device tables", "nvcc and the CUDA toolkit");
}

}  // namespace

absl::Status DeviceTable::Usable(int device) { return NotBuilt(); }

absl::StatusOr<std::unique_ptr<DeviceTable>> DeviceTable::Create(const v1::TableConfig& config,
                                                                 int device) {
  TESSERA_RETURN_IF_ERROR(DescribeTable(config).status());  // a bad config is named first
  return NotBuilt();
}

}  // namespace tessera::embedding::device
