// The CUDA DenseBackend: the CPU backend's DLRM (same layout, initial weights and state
// format: dlrm_layout.h) with parameters, optimizer state and activations on the GPU.
// cuBLAS runs the GEMMs in FP32 (no TF32), cuda_dense_kernels.cu the rest.
//
// Two streams: `compute_` runs the step, `copy_` moves the pooled embeddings in and their
// gradients out, so the embeddings' copy overlaps the bottom MLP and the gradients' copy
// the bottom MLP's backward. They move straight from and to the caller's memory when it
// is page-locked (NewHostFloats), else through pinned staging buffers. ApplyGradients only
// queues the optimizer, which then runs while the caller gathers the next batch's
// embeddings.
//
// The step's kernels and GEMMs (about 60 launches at the default depth) run as four CUDA
// graphs per batch size, captured the first time that size is seen: the bottom MLP, the
// rest of the forward pass, the backward pass down to the embeddings' gradients, and the
// bottom MLP's backward. The copies between them stay outside. TESSERA_CUDA_GRAPHS=0 in
// the environment launches everything one by one instead (same results, bit for bit).

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/cuda_status.h"
#include "base/status.h"
#include "trainer/dense_backend.h"
#include "trainer/internal/cuda_dense_kernels.h"
#include "trainer/internal/dlrm_layout.h"

namespace tessera::trainer_internal {
namespace {

using trainer::DenseOptimizerType;
using trainer::DlrmConfig;

// cuBLAS, loaded when the first backend is made rather than linked: loading it costs a
// process about 0.3 s and 240 MB, which every tessera-train run would pay, GPU or not.
struct CublasApi {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasSetWorkspace_v2) set_workspace;
  decltype(&cublasSgemm_v2) sgemm;
  decltype(&cublasSgemv_v2) sgemv;
  decltype(&cublasSgemmStridedBatched) sgemm_strided_batched;
  decltype(&cublasGetStatusName) status_name;
  decltype(&cublasGetStatusString) status_string;
};

const CublasApi* cublas = nullptr;  // set by LoadCublas

absl::Status LoadCublas() {
  static const absl::Status* loaded = [] {
    const std::string soname = absl::StrCat("libcublas.so.", CUBLAS_VER_MAJOR);
    void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      return new absl::Status(absl::FailedPreconditionError(
          absl::StrCat("cuBLAS could not be loaded (", dlerror(),
                       "); install it or put its folder on LD_LIBRARY_PATH")));
    }
    auto* api = new CublasApi;
    std::string missing;
    auto bind = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (fn == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
    };
    bind(api->create, "cublasCreate_v2");
    bind(api->destroy, "cublasDestroy_v2");
    bind(api->set_stream, "cublasSetStream_v2");
    bind(api->set_math_mode, "cublasSetMathMode");
    bind(api->set_workspace, "cublasSetWorkspace_v2");
    bind(api->sgemm, "cublasSgemm_v2");
    bind(api->sgemv, "cublasSgemv_v2");
    bind(api->sgemm_strided_batched, "cublasSgemmStridedBatched");
    bind(api->status_name, "cublasGetStatusName");
    bind(api->status_string, "cublasGetStatusString");
    if (!missing.empty()) {
      return new absl::Status(absl::FailedPreconditionError(
          absl::StrCat(soname, " lacks ", missing, "; is it the cuBLAS this build needs?")));
    }
    cublas = api;
    return new absl::Status();
  }();
  return *loaded;
}

absl::Status CublasError(cublasStatus_t e, const char* what) {
  return absl::InternalError(absl::StrCat("cuBLAS: ", what, ": ", cublas->status_name(e), " (",
                                          cublas->status_string(e), ")"));
}

#define TESSERA_CUBLAS_RETURN(expr)                                \
  do {                                                             \
    if (cublasStatus_t e_ = (expr); e_ != CUBLAS_STATUS_SUCCESS) { \
      return CublasError(e_, #expr);                               \
    }                                                              \
  } while (0)

// `n` floats of device memory (zero-filled when allocated) or, with kPinned, of pinned
// host memory; grown, never shrunk.
template <bool kPinned>
class CudaFloats {
 public:
  CudaFloats() = default;
  CudaFloats(const CudaFloats&) = delete;
  CudaFloats& operator=(const CudaFloats&) = delete;
  CudaFloats(CudaFloats&& o) noexcept : p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  ~CudaFloats() { Free(); }
  absl::Status Resize(size_t n) {
    if (n <= n_) return absl::OkStatus();
    Free();
    const size_t bytes = std::max<size_t>(n, 1) * sizeof(float);
    if constexpr (kPinned) {
      TESSERA_CUDA_RETURN(cudaMallocHost(&p_, bytes));
    } else {
      TESSERA_CUDA_RETURN(cudaMalloc(&p_, bytes));
      TESSERA_CUDA_RETURN(cudaMemset(p_, 0, bytes));
    }
    n_ = n;
    return absl::OkStatus();
  }
  float* get() const { return p_; }

 private:
  void Free() {
    if (p_ != nullptr) kPinned ? cudaFreeHost(p_) : cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }

  float* p_ = nullptr;
  size_t n_ = 0;
};
using DeviceFloats = CudaFloats<false>;
using PinnedFloats = CudaFloats<true>;

// Whether `p` is page-locked host memory (cudaMallocHost or registered), which copies
// move without staging.
bool IsPageLocked(const void* p) {
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // not an error worth keeping: the pointer is just unknown to CUDA
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}

void* AllocPageLocked(size_t bytes) {
  void* p = nullptr;
  if (cudaMallocHost(&p, bytes) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;  // HostFloats falls back to ordinary memory
  }
  return p;
}

void FreePageLocked(void* p) { cudaFreeHost(p); }

// cuBLAS's workspace, set explicitly so that graph capture allocates nothing (the size
// NVIDIA recommends for Hopper).
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// Batch sizes with captured graphs; others (beyond a run's first few) launch one by one.
constexpr size_t kMaxGraphBatches = 4;

std::string DeviceName(int device) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return absl::StrCat("cuda:", device);
  return absl::StrCat("cuda:", device, " (", prop.name, ")");
}

class CudaDenseBackend final : public trainer::DenseBackend {
 public:
  CudaDenseBackend(const DlrmConfig& config, int device)
      : config_(config), layout_(config), device_(device) {}

  ~CudaDenseBackend() override {
    cudaSetDevice(device_);
    if (compute_ != nullptr) cudaStreamSynchronize(compute_);
    if (copy_ != nullptr) cudaStreamSynchronize(copy_);
    DropGraphs();
    for (cudaEvent_t e : {emb_ready_, emb_grad_ready_, start_, stop_}) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    if (blas_ != nullptr) cublas->destroy(blas_);
    if (compute_ != nullptr) cudaStreamDestroy(compute_);
    if (copy_ != nullptr) cudaStreamDestroy(copy_);
  }

  absl::Status Init() {
    TESSERA_CUDA_RETURN(cudaSetDevice(device_));
    name_ = DeviceName(device_);
    TESSERA_CUDA_RETURN(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    TESSERA_CUDA_RETURN(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    for (cudaEvent_t* e : {&emb_ready_, &emb_grad_ready_}) {
      TESSERA_CUDA_RETURN(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    }
    TESSERA_CUDA_RETURN(cudaEventCreate(&start_));
    TESSERA_CUDA_RETURN(cudaEventCreate(&stop_));
    TESSERA_CUBLAS_RETURN(cublas->create(&blas_));
    TESSERA_CUBLAS_RETURN(cublas->set_stream(blas_, compute_));
    // Plain FP32 GEMMs: TF32 tensor cores (CUBLAS_TF32_TENSOR_OP_MATH) would move the loss
    // further from the CPU backend's than its 1e-4 check allows.
    TESSERA_CUBLAS_RETURN(cublas->set_math_mode(blas_, CUBLAS_DEFAULT_MATH));
    TESSERA_RETURN_IF_ERROR(workspace_.Resize(kCublasWorkspaceBytes / sizeof(float)));
    TESSERA_CUBLAS_RETURN(cublas->set_workspace(blas_, workspace_.get(), kCublasWorkspaceBytes));
    const char* graphs = std::getenv("TESSERA_CUDA_GRAPHS");
    use_graphs_ = graphs == nullptr || std::string_view(graphs) != "0";
    if (!use_graphs_) graphs_off_ = "CUDA graphs off (TESSERA_CUDA_GRAPHS=0)";

    const size_t n = layout_.num_params;
    for (DeviceFloats* d : {&params_, &grads_, &m_, &v_}) TESSERA_RETURN_IF_ERROR(d->Resize(n));
    host_params_ = InitialDlrmParameters(config_, layout_);
    host_grads_.assign(n, 0.0f);
    TESSERA_CUDA_RETURN(
        cudaMemcpy(params_.get(), host_params_.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    host_params_valid_ = true;
    host_grads_valid_ = true;
    return absl::OkStatus();
  }

  std::string name() const override {
    return graphs_off_.empty() ? name_ : absl::StrCat(name_, ", ", graphs_off_);
  }
  const DlrmConfig& config() const override { return config_; }
  trainer::HostFloats NewHostFloats() const override {
    return trainer::HostFloats({AllocPageLocked, FreePageLocked});
  }

  // The host copies: fetched when the device has moved on; a caller may write them, so
  // they go back up before the device next reads them.
  absl::Span<float> Parameters() override {
    Note(FetchParameters());
    host_params_dirty_ = true;
    return absl::MakeSpan(host_params_);
  }
  absl::Span<const float> Gradients() const override {
    Note(FetchGradients());
    return absl::MakeConstSpan(host_grads_);
  }
  absl::Span<float> MutableGradients() override {
    Note(FetchGradients());
    host_grads_dirty_ = true;
    return absl::MakeSpan(host_grads_);
  }

  absl::Status Forward(int batch, const float* dense, const float* embeddings,
                       float* logits) override {
    if (batch <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("batch must be > 0, got ", batch));
    }
    TESSERA_RETURN_IF_ERROR(TakeError());
    TESSERA_CUDA_RETURN(cudaSetDevice(device_));
    TESSERA_RETURN_IF_ERROR(PushHostParameters());
    TESSERA_RETURN_IF_ERROR(EnsureBatch(batch));
    forward_.Close();
    batch_ = batch;
    const int d = config_.emb_dim;
    const size_t emb_floats = static_cast<size_t>(config_.num_sparse) * batch * d;
    const size_t dense_floats = static_cast<size_t>(config_.num_dense) * batch;

    // The embeddings go up on the copy stream while the bottom MLP runs.
    const float* emb_from = embeddings;
    if (!IsPageLocked(embeddings)) {
      std::memcpy(pinned_emb_.get(), embeddings, emb_floats * sizeof(float));
      emb_from = pinned_emb_.get();
    }
    TESSERA_CUDA_RETURN(cudaMemcpyAsync(emb_.get(), emb_from, emb_floats * sizeof(float),
                                        cudaMemcpyHostToDevice, copy_));
    TESSERA_CUDA_RETURN(cudaEventRecord(emb_ready_, copy_));
    std::memcpy(pinned_dense_.get(), dense, dense_floats * sizeof(float));
    TESSERA_CUDA_RETURN(cudaMemcpyAsync(dense_in_.get(), pinned_dense_.get(),
                                        dense_floats * sizeof(float), cudaMemcpyHostToDevice,
                                        compute_));
    const float* z0 = bottom_h_.back().get();
    TESSERA_RETURN_IF_ERROR(Run(kBottomForward, batch, [&]() -> absl::Status {
      return RunLayers(layout_.bottom, dense_in_.get(), bottom_h_, batch);
    }));

    TESSERA_CUDA_RETURN(cudaStreamWaitEvent(compute_, emb_ready_, 0));
    TESSERA_RETURN_IF_ERROR(Run(kTopForward, batch, [&]() -> absl::Status {
      TESSERA_CUDA_RETURN(cuda::GatherInteraction(z0, emb_.get(), t_.get(), d, config_.num_sparse,
                                                  batch, compute_));
      TESSERA_RETURN_IF_ERROR(InteractionGemm(batch));
      TESSERA_CUDA_RETURN(
          cuda::BuildTopInput(z0, gram_.get(), top_in_.get(), d, layout_.f1, batch, compute_));
      TESSERA_RETURN_IF_ERROR(RunLayers(layout_.top, top_in_.get(), top_h_, batch));
      TESSERA_CUDA_RETURN(cudaMemcpyAsync(pinned_logits_.get(), top_h_.back().get(),
                                          batch * sizeof(float), cudaMemcpyDeviceToHost, compute_));
      return absl::OkStatus();
    }));
    TESSERA_CUDA_RETURN(cudaStreamSynchronize(compute_));
    std::memcpy(logits, pinned_logits_.get(), batch * sizeof(float));
    forward_.Open();
    return absl::OkStatus();
  }

  absl::StatusOr<double> Backward(const float* labels, float* embedding_grads) override {
    TESSERA_RETURN_IF_ERROR(forward_.Take());
    TESSERA_RETURN_IF_ERROR(TakeError());
    TESSERA_CUDA_RETURN(cudaSetDevice(device_));
    const int batch = batch_;
    const int d = config_.emb_dim;
    const int f1 = layout_.f1;
    const size_t emb_floats = static_cast<size_t>(config_.num_sparse) * batch * d;

    std::memcpy(pinned_labels_.get(), labels, batch * sizeof(float));
    TESSERA_CUDA_RETURN(cudaMemcpyAsync(labels_.get(), pinned_labels_.get(), batch * sizeof(float),
                                        cudaMemcpyHostToDevice, compute_));
    TESSERA_RETURN_IF_ERROR(Run(kTopBackward, batch, [&]() -> absl::Status {
      TESSERA_CUDA_RETURN(cuda::LossAndDelta(top_h_.back().get(), labels_.get(), loss_.get(),
                                             back_[0].get(), batch, compute_));
      TESSERA_CUDA_RETURN(cudaMemcpyAsync(pinned_loss_.get(), loss_.get(), batch * sizeof(float),
                                          cudaMemcpyDeviceToHost, compute_));
      TESSERA_ASSIGN_OR_RETURN(const float* d_top_in,
                               BackLayers(layout_.top, top_in_.get(), top_h_, back_[0].get(), batch,
                                          /*need_input_grad=*/true));
      // Interaction: dT_b = T_b S_b.
      TESSERA_CUDA_RETURN(cuda::PairGradToSymmetric(d_top_in, gram_.get(), d, f1, batch, compute_));
      TESSERA_RETURN_IF_ERROR(InteractionBackwardGemm(batch));
      TESSERA_CUDA_RETURN(cuda::ScatterInteractionGrad(d_top_in, dt_.get(), d_z0_.get(),
                                                       emb_grad_.get(), d, f1, batch, compute_));
      return absl::OkStatus();
    }));
    // The embeddings' gradients go down on the copy stream while the bottom MLP's backward
    // runs.
    const bool direct = IsPageLocked(embedding_grads);
    TESSERA_CUDA_RETURN(cudaEventRecord(emb_grad_ready_, compute_));
    TESSERA_CUDA_RETURN(cudaStreamWaitEvent(copy_, emb_grad_ready_, 0));
    TESSERA_CUDA_RETURN(cudaMemcpyAsync(direct ? embedding_grads : pinned_emb_grad_.get(),
                                        emb_grad_.get(), emb_floats * sizeof(float),
                                        cudaMemcpyDeviceToHost, copy_));
    TESSERA_RETURN_IF_ERROR(Run(kBottomBackward, batch, [&]() -> absl::Status {
      return BackLayers(layout_.bottom, dense_in_.get(), bottom_h_, d_z0_.get(), batch,
                        /*need_input_grad=*/false)
          .status();
    }));
    host_grads_valid_ = false;
    host_grads_dirty_ = false;
    TESSERA_CUDA_RETURN(cudaStreamSynchronize(copy_));
    if (!direct) {
      std::memcpy(embedding_grads, pinned_emb_grad_.get(), emb_floats * sizeof(float));
    }
    TESSERA_CUDA_RETURN(cudaStreamSynchronize(compute_));
    double loss = 0.0;
    for (int b = 0; b < batch; ++b) loss += pinned_loss_.get()[b];
    return loss / batch;
  }

  void ApplyGradients() override { Note(QueueOptimizer()); }

  std::string SaveState() const override {
    const size_t n = layout_.num_params;
    std::vector<float> p, m(n), v(n);
    std::vector<std::pair<const float*, std::vector<float>*>> what = {{m_.get(), &m},
                                                                      {v_.get(), &v}};
    if (host_params_dirty_) {
      p = host_params_;  // newer than the device's until the next step
    } else {
      p.resize(n);
      what.push_back({params_.get(), &p});
    }
    absl::Status s = Download(std::move(what));
    if (!s.ok()) {
      // SaveState cannot fail by its signature: keep the error for the next step and hand
      // back bytes that no LoadState accepts.
      Note(s);
      return "";
    }
    return EncodeDenseState(p, m, v, adam_t_);
  }

  absl::Status LoadState(absl::string_view state) override {
    const size_t n = layout_.num_params;
    std::vector<float> p(n), m(n), v(n);
    int64_t t = 0;
    TESSERA_RETURN_IF_ERROR(
        DecodeDenseState(state, absl::MakeSpan(p), absl::MakeSpan(m), absl::MakeSpan(v), &t));
    TESSERA_CUDA_RETURN(cudaSetDevice(device_));
    TESSERA_CUDA_RETURN(cudaStreamSynchronize(compute_));
    for (auto [dst, src] : {std::pair{params_.get(), &p}, {m_.get(), &m}, {v_.get(), &v}}) {
      TESSERA_CUDA_RETURN(cudaMemcpy(dst, src->data(), n * sizeof(float), cudaMemcpyHostToDevice));
    }
    host_params_ = std::move(p);
    host_params_valid_ = true;
    host_params_dirty_ = false;
    adam_t_ = t;
    forward_.Close();
    return absl::OkStatus();
  }

  // Mean seconds of one step's GEMMs alone (the forward, the interaction and both
  // backward GEMMs of every layer), over `repeats` steps after one warm-up step.
  absl::StatusOr<double> TimeGemms(int batch, int repeats) {
    TESSERA_CUDA_RETURN(cudaSetDevice(device_));
    TESSERA_RETURN_IF_ERROR(EnsureBatch(batch));
    for (int r = -1; r < repeats; ++r) {
      if (r == 0) TESSERA_CUDA_RETURN(cudaEventRecord(start_, compute_));
      // Both backward GEMMs of every layer (need_input_grad), as StepFlops counts them.
      TESSERA_RETURN_IF_ERROR(RunLayers(layout_.bottom, dense_in_.get(), bottom_h_, batch, true));
      TESSERA_RETURN_IF_ERROR(InteractionGemm(batch));
      TESSERA_RETURN_IF_ERROR(RunLayers(layout_.top, top_in_.get(), top_h_, batch, true));
      TESSERA_RETURN_IF_ERROR(
          BackLayers(layout_.top, top_in_.get(), top_h_, back_[0].get(), batch, true, true)
              .status());
      TESSERA_RETURN_IF_ERROR(InteractionBackwardGemm(batch));
      TESSERA_RETURN_IF_ERROR(
          BackLayers(layout_.bottom, dense_in_.get(), bottom_h_, d_z0_.get(), batch, true, true)
              .status());
    }
    TESSERA_CUDA_RETURN(cudaEventRecord(stop_, compute_));
    TESSERA_CUDA_RETURN(cudaEventSynchronize(stop_));
    float ms = 0;
    TESSERA_CUDA_RETURN(cudaEventElapsedTime(&ms, start_, stop_));
    return ms / 1e3 / std::max(repeats, 1);
  }

 private:
  // Keeps the first error of a call that cannot return one; the next step returns it.
  void Note(const absl::Status& s) const {
    if (!s.ok() && error_.ok()) error_ = s;
  }
  absl::Status TakeError() {
    absl::Status s = error_;
    error_ = absl::OkStatus();
    return s;
  }

  absl::Status Download(std::vector<std::pair<const float*, std::vector<float>*>> what) const {
    TESSERA_CUDA_RETURN(cudaSetDevice(device_));
    TESSERA_CUDA_RETURN(cudaStreamSynchronize(compute_));
    for (auto& [src, dst] : what) {
      TESSERA_CUDA_RETURN(
          cudaMemcpy(dst->data(), src, dst->size() * sizeof(float), cudaMemcpyDeviceToHost));
    }
    return absl::OkStatus();
  }

  absl::Status FetchParameters() {
    if (host_params_valid_ || host_params_dirty_) return absl::OkStatus();
    TESSERA_RETURN_IF_ERROR(Download({{params_.get(), &host_params_}}));
    host_params_valid_ = true;
    return absl::OkStatus();
  }

  absl::Status FetchGradients() const {
    if (host_grads_valid_ || host_grads_dirty_) return absl::OkStatus();
    TESSERA_RETURN_IF_ERROR(Download({{grads_.get(), &host_grads_}}));
    host_grads_valid_ = true;
    return absl::OkStatus();
  }

  absl::Status PushHostParameters() {
    if (!host_params_dirty_) return absl::OkStatus();
    TESSERA_CUDA_RETURN(cudaMemcpyAsync(params_.get(), host_params_.data(),
                                        host_params_.size() * sizeof(float), cudaMemcpyHostToDevice,
                                        compute_));
    TESSERA_CUDA_RETURN(cudaStreamSynchronize(compute_));
    host_params_dirty_ = false;
    host_params_valid_ = true;
    return absl::OkStatus();
  }

  absl::Status QueueOptimizer() {
    TESSERA_RETURN_IF_ERROR(error_);
    TESSERA_CUDA_RETURN(cudaSetDevice(device_));
    TESSERA_RETURN_IF_ERROR(PushHostParameters());
    const size_t n = layout_.num_params;
    if (host_grads_dirty_) {
      TESSERA_CUDA_RETURN(cudaMemcpyAsync(grads_.get(), host_grads_.data(), n * sizeof(float),
                                          cudaMemcpyHostToDevice, compute_));
      TESSERA_CUDA_RETURN(cudaStreamSynchronize(compute_));
      host_grads_dirty_ = false;
      host_grads_valid_ = true;
    }
    const float lr = config_.learning_rate;
    if (config_.optimizer == DenseOptimizerType::kSgd) {
      TESSERA_CUDA_RETURN(cuda::SgdStep(params_.get(), grads_.get(), n, lr, compute_));
    } else {
      ++adam_t_;
      const float c1 = 1.0f - static_cast<float>(std::pow(config_.beta1, adam_t_));
      const float c2 = 1.0f - static_cast<float>(std::pow(config_.beta2, adam_t_));
      TESSERA_CUDA_RETURN(cuda::AdamStep(params_.get(), m_.get(), v_.get(), grads_.get(), n, lr,
                                         config_.beta1, config_.beta2, config_.epsilon, c1, c2,
                                         compute_));
    }
    host_params_valid_ = false;
    return absl::OkStatus();
  }

  // The step's segments that run as CUDA graphs.
  enum Segment { kBottomForward, kTopForward, kTopBackward, kBottomBackward, kSegments };
  struct Graphs {
    int batch = 0;
    cudaGraphExec_t exec[kSegments] = {};
  };

  // Runs `launch` (which queues segment `segment` of a step at `batch` on compute_) as a
  // graph: captured from `launch` the first time, replayed after. Launches directly where
  // graphs are off or every graph slot holds another batch size. A capture that fails
  // turns graphs off for good and launches directly: graphs only save launch time.
  template <typename Launch>
  absl::Status Run(Segment segment, int batch, Launch&& launch) {
    if (!use_graphs_) return launch();
    Graphs* g = nullptr;
    for (Graphs& have : graphs_) {
      if (have.batch == batch) g = &have;
    }
    if (g == nullptr) {
      if (graphs_.size() >= kMaxGraphBatches) return launch();
      g = &graphs_.emplace_back();
      g->batch = batch;
    }
    if (g->exec[segment] == nullptr) {
      cudaGraph_t graph = nullptr;
      if (cudaError_t e = cudaStreamBeginCapture(compute_, cudaStreamCaptureModeThreadLocal);
          e != cudaSuccess) {
        return GraphsFailed(launch, absl::StrCat("begin capture: ", cudaGetErrorName(e)));
      }
      const absl::Status queued = launch();
      const cudaError_t ended = cudaStreamEndCapture(compute_, &graph);
      cudaError_t made = ended;
      if (queued.ok() && ended == cudaSuccess) {
        made = cudaGraphInstantiate(&g->exec[segment], graph, 0);
      }
      if (graph != nullptr) cudaGraphDestroy(graph);
      if (!queued.ok() || made != cudaSuccess) {
        g->exec[segment] = nullptr;
        return GraphsFailed(launch, queued.ok() ? cudaGetErrorName(made) : queued.ToString());
      }
    }
    TESSERA_CUDA_RETURN(cudaGraphLaunch(g->exec[segment], compute_));
    return absl::OkStatus();
  }

  template <typename Launch>
  absl::Status GraphsFailed(Launch&& launch, const std::string& why) {
    cudaGetLastError();  // the capture's error, not the step's
    DropGraphs();
    use_graphs_ = false;
    graphs_off_ = absl::StrCat("CUDA graphs off (capture failed: ", why, ")");
    return launch();  // a real error (bad arguments, a dead device) shows here
  }

  void DropGraphs() {
    for (Graphs& g : graphs_) {
      for (cudaGraphExec_t e : g.exec) {
        if (e != nullptr) cudaGraphExecDestroy(e);
      }
    }
    graphs_.clear();
  }

  // Buffers for `batch` samples (grown, never shrunk).
  absl::Status EnsureBatch(int batch) {
    if (batch <= capacity_) return absl::OkStatus();
    TESSERA_CUDA_RETURN(cudaStreamSynchronize(compute_));
    TESSERA_CUDA_RETURN(cudaStreamSynchronize(copy_));
    DropGraphs();  // they hold the old buffers' addresses
    const size_t b = batch;
    const size_t d = config_.emb_dim;
    const size_t f1 = layout_.f1;
    const size_t emb = config_.num_sparse * b * d;
    size_t widest = layout_.top_in;
    bottom_h_.resize(layout_.bottom.size());
    top_h_.resize(layout_.top.size());
    for (size_t l = 0; l < layout_.bottom.size(); ++l) {
      TESSERA_RETURN_IF_ERROR(bottom_h_[l].Resize(layout_.bottom[l].out * b));
      widest = std::max<size_t>(widest, std::max(layout_.bottom[l].in, layout_.bottom[l].out));
    }
    for (size_t l = 0; l < layout_.top.size(); ++l) {
      TESSERA_RETURN_IF_ERROR(top_h_[l].Resize(layout_.top[l].out * b));
      widest = std::max<size_t>(widest, std::max(layout_.top[l].in, layout_.top[l].out));
    }
    TESSERA_RETURN_IF_ERROR(dense_in_.Resize(config_.num_dense * b));
    TESSERA_RETURN_IF_ERROR(emb_.Resize(emb));
    TESSERA_RETURN_IF_ERROR(emb_grad_.Resize(emb));
    TESSERA_RETURN_IF_ERROR(t_.Resize(b * f1 * d));
    TESSERA_RETURN_IF_ERROR(dt_.Resize(b * f1 * d));
    TESSERA_RETURN_IF_ERROR(gram_.Resize(b * f1 * f1));
    TESSERA_RETURN_IF_ERROR(top_in_.Resize(layout_.top_in * b));
    TESSERA_RETURN_IF_ERROR(d_z0_.Resize(d * b));
    TESSERA_RETURN_IF_ERROR(labels_.Resize(b));
    TESSERA_RETURN_IF_ERROR(loss_.Resize(b));
    TESSERA_RETURN_IF_ERROR(back_[0].Resize(widest * b));
    TESSERA_RETURN_IF_ERROR(back_[1].Resize(widest * b));
    TESSERA_RETURN_IF_ERROR(ones_.Resize(b));
    TESSERA_CUDA_RETURN(cuda::Fill(ones_.get(), b, 1.0f, compute_));
    TESSERA_RETURN_IF_ERROR(pinned_emb_.Resize(emb));
    TESSERA_RETURN_IF_ERROR(pinned_emb_grad_.Resize(emb));
    TESSERA_RETURN_IF_ERROR(pinned_dense_.Resize(config_.num_dense * b));
    TESSERA_RETURN_IF_ERROR(pinned_labels_.Resize(b));
    TESSERA_RETURN_IF_ERROR(pinned_logits_.Resize(b));
    TESSERA_RETURN_IF_ERROR(pinned_loss_.Resize(b));
    capacity_ = batch;
    return absl::OkStatus();
  }

  // h[l] = act(W_l h[l-1] + b_l); h[-1] = input. `gemms_only` (TimeGemms): W_l h[l-1].
  absl::Status RunLayers(const std::vector<DenseLayer>& layers, const float* input,
                         std::vector<DeviceFloats>& h, int batch, bool gemms_only = false) {
    const float one = 1.0f, zero = 0.0f;
    const float* prev = input;
    for (size_t l = 0; l < layers.size(); ++l) {
      const DenseLayer& L = layers[l];
      TESSERA_CUBLAS_RETURN(cublas->sgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, L.out, batch, L.in, &one,
                                          params_.get() + L.w_at, L.out, prev, L.in, &zero,
                                          h[l].get(), L.out));
      if (!gemms_only) {
        TESSERA_CUDA_RETURN(
            cuda::BiasRelu(h[l].get(), params_.get() + L.b_at, L.out, batch, L.relu, compute_));
      }
      prev = h[l].get();
    }
    return absl::OkStatus();
  }

  // Backward through `layers` from dL/d(last output) in `delta` (scratch: one of back_ or
  // d_z0_); fills the layers' gradients and returns dL/d input when asked (in back_).
  // `gemms_only` (TimeGemms): the weight and input gradients' GEMMs, without the ReLU mask
  // and the bias gradients.
  absl::StatusOr<float*> BackLayers(const std::vector<DenseLayer>& layers, const float* input,
                                    const std::vector<DeviceFloats>& h, float* delta, int batch,
                                    bool need_input_grad, bool gemms_only = false) {
    const float one = 1.0f, zero = 0.0f;
    int next_buffer = delta == back_[0].get() ? 1 : 0;
    for (int l = static_cast<int>(layers.size()) - 1; l >= 0; --l) {
      const DenseLayer& L = layers[l];
      if (L.relu && !gemms_only) {
        TESSERA_CUDA_RETURN(cuda::ReluBackward(delta, h[l].get(), L.out * batch, compute_));
      }
      const float* prev = l == 0 ? input : h[l - 1].get();
      TESSERA_CUBLAS_RETURN(cublas->sgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_T, L.out, L.in, batch, &one,
                                          delta, L.out, prev, L.in, &zero, grads_.get() + L.w_at,
                                          L.out));
      if (!gemms_only) {
        TESSERA_CUBLAS_RETURN(cublas->sgemv(blas_, CUBLAS_OP_N, L.out, batch, &one, delta, L.out,
                                            ones_.get(), 1, &zero, grads_.get() + L.b_at, 1));
      }
      if (l > 0 || need_input_grad) {
        float* next = back_[next_buffer].get();
        TESSERA_CUBLAS_RETURN(cublas->sgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, L.in, batch, L.out,
                                            &one, params_.get() + L.w_at, L.out, delta, L.out,
                                            &zero, next, L.in));
        delta = next;
        next_buffer ^= 1;
      }
    }
    return need_input_grad ? delta : nullptr;
  }

  // gram_b = T_b^T T_b (f1, f1) for every sample.
  absl::Status InteractionGemm(int batch) {
    const float one = 1.0f, zero = 0.0f;
    const int d = config_.emb_dim, f1 = layout_.f1;
    TESSERA_CUBLAS_RETURN(cublas->sgemm_strided_batched(
        blas_, CUBLAS_OP_T, CUBLAS_OP_N, f1, f1, d, &one, t_.get(), d,
        static_cast<long long>(d) * f1, t_.get(), d, static_cast<long long>(d) * f1, &zero,
        gram_.get(), f1, static_cast<long long>(f1) * f1, batch));
    return absl::OkStatus();
  }

  // dT_b = T_b S_b (d, f1), with S_b in gram_.
  absl::Status InteractionBackwardGemm(int batch) {
    const float one = 1.0f, zero = 0.0f;
    const int d = config_.emb_dim, f1 = layout_.f1;
    TESSERA_CUBLAS_RETURN(cublas->sgemm_strided_batched(
        blas_, CUBLAS_OP_N, CUBLAS_OP_N, d, f1, f1, &one, t_.get(), d,
        static_cast<long long>(d) * f1, gram_.get(), f1, static_cast<long long>(f1) * f1, &zero,
        dt_.get(), d, static_cast<long long>(d) * f1, batch));
    return absl::OkStatus();
  }

  DlrmConfig config_;
  DlrmLayout layout_;
  int device_;
  std::string name_;
  cudaStream_t compute_ = nullptr, copy_ = nullptr;
  cudaEvent_t emb_ready_ = nullptr, emb_grad_ready_ = nullptr, start_ = nullptr, stop_ = nullptr;
  cublasHandle_t blas_ = nullptr;

  DeviceFloats params_, grads_, m_, v_;
  DeviceFloats workspace_;  // cuBLAS's
  int64_t adam_t_ = 0;
  bool use_graphs_ = true;
  std::string graphs_off_;  // why not, for name()
  std::vector<Graphs> graphs_;
  // Host copies of the parameters and gradients (see Parameters()).
  std::vector<float> host_params_;
  mutable std::vector<float> host_grads_;
  bool host_params_valid_ = false, host_params_dirty_ = false;
  mutable bool host_grads_valid_ = false;
  bool host_grads_dirty_ = false;
  mutable absl::Status error_;

  int capacity_ = 0;  // samples the buffers below hold
  int batch_ = 0;
  ForwardGate forward_;  // open from a Forward to its Backward
  std::vector<DeviceFloats> bottom_h_, top_h_;
  DeviceFloats dense_in_, emb_, emb_grad_, t_, dt_, gram_, top_in_, d_z0_, labels_, loss_, ones_;
  DeviceFloats back_[2];
  PinnedFloats pinned_emb_, pinned_emb_grad_, pinned_dense_, pinned_labels_, pinned_logits_,
      pinned_loss_;
};

// Why GPU `device` cannot run the backend, naming what is missing; OK when it can.
absl::Status CudaUsable(int device) {
  TESSERA_RETURN_IF_ERROR(base::CudaDeviceUsable(device, "the CUDA backend needs"));
  return LoadCublas();
}

absl::StatusOr<std::unique_ptr<CudaDenseBackend>> MakeCudaBackend(const DlrmConfig& config,
                                                                  int device) {
  TESSERA_RETURN_IF_ERROR(trainer::ValidateDlrmConfig(config));
  TESSERA_RETURN_IF_ERROR(CudaUsable(device));
  auto backend = std::make_unique<CudaDenseBackend>(config, device);
  TESSERA_RETURN_IF_ERROR(backend->Init());
  return backend;
}

}  // namespace
}  // namespace tessera::trainer_internal

namespace tessera::trainer {

bool HaveCudaBackend() { return true; }

absl::Status CudaBackendUsable(int device) { return trainer_internal::CudaUsable(device); }

absl::StatusOr<std::unique_ptr<DenseBackend>> NewCudaDenseBackend(const DlrmConfig& config,
                                                                  int device) {
  auto backend = trainer_internal::MakeCudaBackend(config, device);
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<DenseBackend>(std::move(*backend));
}

absl::StatusOr<double> CudaDlrmGemmSeconds(const DlrmConfig& config, int batch, int repeats,
                                           int device) {
  if (batch <= 0 || repeats <= 0) {
    return absl::InvalidArgumentError("batch and repeats must be > 0");
  }
  auto backend = trainer_internal::MakeCudaBackend(config, device);
  if (!backend.ok()) return backend.status();
  return (*backend)->TimeGemms(batch, repeats);
}

}  // namespace tessera::trainer
