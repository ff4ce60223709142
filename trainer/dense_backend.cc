#include "trainer/dense_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera::trainer {

HostFloats::HostFloats(HostFloats&& other) noexcept
    : allocator_(other.allocator_),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      capacity_(std::exchange(other.capacity_, 0)),
      free_(std::exchange(other.free_, nullptr)) {}

HostFloats& HostFloats::operator=(HostFloats&& other) noexcept {
  if (this != &other) {
    Release();
    allocator_ = other.allocator_;
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    free_ = std::exchange(other.free_, nullptr);
  }
  return *this;
}

HostFloats::~HostFloats() { Release(); }

void HostFloats::Release() {
  if (data_ != nullptr) free_(data_);
  data_ = nullptr;
  size_ = capacity_ = 0;
}

void HostFloats::resize(size_t n) {
  if (n > capacity_) {
    const size_t capacity = std::max(n, capacity_ + capacity_ / 2);
    const size_t bytes = capacity * sizeof(float);
    void* p = allocator_.alloc != nullptr ? allocator_.alloc(bytes) : nullptr;
    void (*free)(void*) = allocator_.free;
    if (p == nullptr) {
      p = std::malloc(bytes);
      free = std::free;
      if (p == nullptr) throw std::bad_alloc();
    }
    float* grown = static_cast<float*>(p);
    if (size_ > 0) std::memcpy(grown, data_, size_ * sizeof(float));
    const size_t size = size_;
    Release();
    data_ = grown;
    free_ = free;
    size_ = size;
    capacity_ = capacity;
  }
  if (n > size_) std::memset(data_ + size_, 0, (n - size_) * sizeof(float));
  size_ = n;
}

std::vector<DlrmLayerShape> DlrmLayerShapes(const DlrmConfig& config, size_t* bottom_layers) {
  std::vector<DlrmLayerShape> layers;
  int in = config.num_dense;
  for (const int w : config.bottom_mlp) {
    layers.push_back({in, w, true});
    in = w;
  }
  layers.push_back({in, config.emb_dim, true});
  if (bottom_layers != nullptr) *bottom_layers = layers.size();
  const int f1 = config.num_sparse + 1;
  in = config.emb_dim + f1 * (f1 - 1) / 2;
  for (const int w : config.top_mlp) {
    layers.push_back({in, w, true});
    in = w;
  }
  layers.push_back({in, 1, false});
  return layers;
}

absl::Status ValidateDlrmConfig(const DlrmConfig& c) {
  if (c.num_dense <= 0 || c.num_sparse < 0 || c.emb_dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model needs num_dense > 0, num_sparse >= 0 and emb_dim > 0; got ",
                     c.num_dense, ", ", c.num_sparse, ", ", c.emb_dim));
  }
  for (int w : c.bottom_mlp) {
    if (w <= 0) return absl::InvalidArgumentError(absl::StrCat("bottom_mlp width ", w, " <= 0"));
  }
  for (int w : c.top_mlp) {
    if (w <= 0) return absl::InvalidArgumentError(absl::StrCat("top_mlp width ", w, " <= 0"));
  }
  if (!(c.learning_rate > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense learning rate must be > 0, got ", c.learning_rate));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DenseBackend>> NewDenseBackend(absl::string_view kind,
                                                              const DlrmConfig& config) {
  if (kind == "cpu") return NewCpuDenseBackend(config);
  if (kind == "cuda") return NewCudaDenseBackend(config);
  return absl::InvalidArgumentError(
      absl::StrCat("dense backend must be cpu or cuda, got '", kind, "'"));
}

}  // namespace tessera::trainer
