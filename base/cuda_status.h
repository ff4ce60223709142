#ifndef TESSERA_BASE_CUDA_STATUS_H_
#define TESSERA_BASE_CUDA_STATUS_H_

// CUDA runtime errors as absl::Status, for the host code of CUDA-built sources only (the
// CUDA dense backend, device tables): include it where cuda_runtime_api.h is available.

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tessera::base {

// Internal "CUDA: <what>: <name> (<description>)".
inline absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(
      absl::StrCat("CUDA: ", what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

// Why CUDA device `device` cannot be used, naming what is missing (the driver, one new
// enough for this build's runtime, a device, that device), as FailedPrecondition;
// `who_needs` says what needs it ("the CUDA backend needs"). OK when it can.
inline absl::Status CudaDeviceUsable(int device, absl::string_view who_needs) {
  int driver = 0, runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no NVIDIA driver is installed (libcuda.so.1 not found); ", who_needs,
                     " a driver and a GPU"));
  }
  auto version = [](int v) { return absl::StrCat(v / 1000, ".", v % 1000 / 10); };
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorInsufficientDriver) {
    return absl::FailedPreconditionError(
        absl::StrCat("the NVIDIA driver supports CUDA ", version(driver),
                     " but this build needs CUDA ", version(runtime), "; update the driver"));
  }
  if (e != cudaSuccess || count == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device (driver for CUDA ", version(driver),
        "): ", e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports 0 devices"));
  }
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device, " does not exist (", count, " visible)"));
  }
  return absl::OkStatus();
}

}  // namespace tessera::base

// Returns CudaError from the enclosing function when `expr` is not cudaSuccess.
#define TESSERA_CUDA_RETURN(expr)                     \
  do {                                                \
    if (cudaError_t e_ = (expr); e_ != cudaSuccess) { \
      return ::tessera::base::CudaError(e_, #expr);   \
    }                                                 \
  } while (0)

#endif  // TESSERA_BASE_CUDA_STATUS_H_
