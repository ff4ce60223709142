#ifndef TESSERA_TRAINER_DENSE_BACKEND_H_
#define TESSERA_TRAINER_DENSE_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tessera::trainer {

enum class DenseOptimizerType { kAdam, kSgd };

// Shape and optimizer of the DLRM dense network.
struct DlrmConfig {
  int num_dense = 13;                      // dense input features
  int num_sparse = 26;                     // pooled embedding inputs, one per sparse feature
  int emb_dim = 16;                        // embedding dimension; the bottom MLP ends at it
  std::vector<int> bottom_mlp = {64, 32};  // hidden widths before the final emb_dim layer
  std::vector<int> top_mlp = {64, 32};     // hidden widths before the final logit layer
  DenseOptimizerType optimizer = DenseOptimizerType::kAdam;
  float learning_rate = 1e-3f;  // dense learning rate
  float beta1 = 0.9f;           // Adam
  float beta2 = 0.999f;         // Adam
  float epsilon = 1e-8f;        // Adam
  uint64_t seed = 1;            // parameter initialisation
};

// Checks widths and rates; InvalidArgument names the bad field.
absl::Status ValidateDlrmConfig(const DlrmConfig& config);

// One linear layer of a DLRM: `in` inputs, `out` outputs, and whether a ReLU follows.
struct DlrmLayerShape {
  int in = 0;
  int out = 0;
  bool relu = true;
};

// The linear layers of `config`'s DLRM, in order: the bottom MLP (num_dense -> ... ->
// emb_dim, ReLU throughout), then the top MLP (emb_dim + f1 (f1 - 1) / 2 -> ... -> 1, no
// ReLU on the logit), f1 = num_sparse + 1 being the vectors of the pairwise interaction.
// `bottom_layers` (when given) gets how many of them are the bottom MLP's.
std::vector<DlrmLayerShape> DlrmLayerShapes(const DlrmConfig& config,
                                            size_t* bottom_layers = nullptr);

// Floats in host memory for the embeddings a DenseBackend's Forward reads and the
// gradients its Backward writes, allocated the way that backend moves them fastest
// (DenseBackend::NewHostFloats): page-locked for the CUDA backend, which then copies them to
// and from the device directly instead of through a staging buffer; ordinary memory
// otherwise. Grown by resize, which keeps the contents as std::vector does; move-only.
class HostFloats {
 public:
  // How its memory is allocated and freed; alloc returns nullptr when it cannot, and
  // HostFloats then falls back to ordinary memory.
  struct Allocator {
    void* (*alloc)(size_t bytes) = nullptr;
    void (*free)(void* p) = nullptr;
  };

  HostFloats() = default;  // ordinary memory
  explicit HostFloats(Allocator allocator) : allocator_(allocator) {}
  HostFloats(HostFloats&& other) noexcept;
  HostFloats& operator=(HostFloats&& other) noexcept;
  HostFloats(const HostFloats&) = delete;
  HostFloats& operator=(const HostFloats&) = delete;
  ~HostFloats();

  void resize(size_t n);  // new floats are zero
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  float* data() { return data_; }
  const float* data() const { return data_; }
  float* begin() { return data_; }
  float* end() { return data_ + size_; }
  const float* begin() const { return data_; }
  const float* end() const { return data_ + size_; }
  float& operator[](size_t i) { return data_[i]; }
  const float& operator[](size_t i) const { return data_[i]; }

 private:
  void Release();

  Allocator allocator_;
  float* data_ = nullptr;
  size_t size_ = 0, capacity_ = 0;
  void (*free_)(void*) = nullptr;  // how data_ goes back
};

// The dense half of DLRM on some device: bottom MLP over dense features, pairwise dot
// interaction of its output with the pooled embeddings, top MLP to one logit, sigmoid
// and binary cross-entropy (mean over the batch). The sparse half (embedding tables)
// lives outside; this class consumes pooled embeddings and returns their gradients.
//
// Layouts: dense (batch, num_dense) row-major; embeddings and their gradients
// (num_sparse, batch, emb_dim) row-major, one block per sparse feature.
//
// Thread safety: none; one training thread owns a backend.
class DenseBackend {
 public:
  virtual ~DenseBackend() = default;

  virtual std::string name() const = 0;

  // Forward pass for `batch` samples; writes `logits` (batch) and keeps what Backward
  // needs. InvalidArgument for a non-positive batch.
  virtual absl::Status Forward(int batch, const float* dense, const float* embeddings,
                               float* logits) = 0;

  // Backward pass of the last Forward against `labels` (batch, 0 or 1): fills the
  // parameter gradients and `embedding_grads` (num_sparse, batch, emb_dim), and returns
  // the mean loss. FailedPrecondition when no Forward came first.
  virtual absl::StatusOr<double> Backward(const float* labels, float* embedding_grads) = 0;

  // One optimizer step on the parameters with the gradients of the last Backward.
  virtual void ApplyGradients() = 0;

  // All parameters as one flat array (layer by layer: weights then biases), and the
  // matching gradients. Writes to Parameters() take effect on the next Forward.
  virtual absl::Span<float> Parameters() = 0;
  virtual absl::Span<const float> Gradients() const = 0;
  // The gradients of the last Backward, to change before ApplyGradients (data-parallel
  // workers replace them by the workers' mean).
  virtual absl::Span<float> MutableGradients() = 0;

  virtual const DlrmConfig& config() const = 0;

  // An empty buffer for Forward's embeddings or Backward's embedding gradients in the host
  // memory this backend moves fastest (see HostFloats). Any memory works for those
  // arguments; this saves the CUDA backend a copy of each.
  virtual HostFloats NewHostFloats() const { return HostFloats(); }

  // Parameters and optimizer state (Adam's moments and step count) as bytes, and back:
  // a backend loaded from the state saved after step k continues bit for bit as the one
  // that saved it. LoadState: InvalidArgument for state of another model shape,
  // DataLoss for truncated or corrupt bytes; the backend is unchanged then.
  virtual std::string SaveState() const = 0;
  virtual absl::Status LoadState(absl::string_view state) = 0;
};

// The CPU backend on Eigen.
absl::StatusOr<std::unique_ptr<DenseBackend>> NewCpuDenseBackend(const DlrmConfig& config);

// The CUDA backend on GPU `device` (cuBLAS): parameters, optimizer state and activations
// on the device, the same initial weights as the CPU backend for the same config, and a
// state either backend loads. FailedPrecondition naming what is missing when it cannot
// run here: a build without it (TESSERA_CUDA=OFF or no nvcc), no NVIDIA driver, a driver
// older than the build's CUDA, no device.
absl::StatusOr<std::unique_ptr<DenseBackend>> NewCudaDenseBackend(const DlrmConfig& config,
                                                                  int device = 0);

// Whether this build has the CUDA backend, and why it cannot run on GPU `device` here (OK
// when it can), as NewCudaDenseBackend would say.
bool HaveCudaBackend();
absl::Status CudaBackendUsable(int device = 0);

// The backend named `kind`: "cpu" or "cuda" (device 0). InvalidArgument for another name.
absl::StatusOr<std::unique_ptr<DenseBackend>> NewDenseBackend(absl::string_view kind,
                                                              const DlrmConfig& config);

// Seconds one training step's GEMMs take with cuBLAS alone at `batch` on GPU `device`
// (every layer's forward GEMM and both backward GEMMs, the interaction's two batched
// GEMMs), the mean over `repeats` steps: the ceiling of the CUDA backend's step. Errors as
// NewCudaDenseBackend.
absl::StatusOr<double> CudaDlrmGemmSeconds(const DlrmConfig& config, int batch, int repeats,
                                           int device = 0);

}  // namespace tessera::trainer

#endif  // TESSERA_TRAINER_DENSE_BACKEND_H_
