// The CUDA backend's entry points in a build without it (TESSERA_CUDA=OFF, or AUTO where
// no nvcc was found): each says so, and how to get a build that has it.

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "trainer/dense_backend.h"

namespace tessera::trainer {
namespace {

absl::Status NotBuilt() { return NotBuiltWithoutCuda("CUDA backend", "nvcc and cuBLAS"); }

}  // namespace

bool HaveCudaBackend() { return false; }

absl::Status CudaBackendUsable(int device) { return NotBuilt(); }

absl::StatusOr<std::unique_ptr<DenseBackend>> NewCudaDenseBackend(const DlrmConfig& config,
                                                                  int device) {
  return NotBuilt();
}

absl::StatusOr<double> CudaDlrmGemmSeconds(const DlrmConfig& config, int batch, int repeats,
                                           int device) {
  return NotBuilt();
}

}  // namespace tessera::trainer
