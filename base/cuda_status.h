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

}  // namespace tessera::base

// Returns CudaError from the enclosing function when `expr` is not cudaSuccess.
#define TESSERA_CUDA_RETURN(expr)                     \
  do {                                                \
    if (cudaError_t e_ = (expr); e_ != cudaSuccess) { \
      return ::tessera::base::CudaError(e_, #expr);   \
    }                                                 \
  } while (0)

#endif  // TESSERA_BASE_CUDA_STATUS_H_
