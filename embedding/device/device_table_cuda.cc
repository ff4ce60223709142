// DeviceTable on a CUDA GPU: the table's arrays in device memory (table_layout.h), each
// call's ids and buffers copied in, the kernels of device_table_kernels.cu run on the
// table's stream, and the answer copied out. Host C++; only the kernels are CUDA.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/cuda_status.h"
#include "base/status.h"
#include "embedding/batch_ops.h"
#include "embedding/device/device_table.h"
#include "embedding/device/device_table_kernels.h"
#include "embedding/device/table_layout.h"

namespace tessera::embedding::device {
namespace {

// Device memory that frees itself; grown, never shrunk, by Reserve.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  absl::Status Reserve(size_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    if (p_ != nullptr) cudaFree(p_);
    p_ = nullptr;
    bytes_ = 0;
    if (cudaError_t e = cudaMalloc(&p_, bytes); e != cudaSuccess) {
      cudaGetLastError();  // clear it
      return absl::ResourceExhaustedError(absl::StrCat(
          "CUDA: cannot allocate ", bytes, " bytes of device memory: ", cudaGetErrorString(e)));
    }
    bytes_ = bytes;
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

absl::Status CheckDevice(int device) {
  return base::CudaDeviceUsable(device, "device tables need");
}

class CudaDeviceTable final : public DeviceTable {
 public:
  CudaDeviceTable(const v1::TableConfig& config, const TableLayout& layout, int device)
      : config_(config), layout_(layout), device_(device) {}
  ~CudaDeviceTable() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init();

  const v1::TableConfig& config() const override { return config_; }
  int64_t num_rows() const override;
  int64_t max_rows() const override { return layout_.max_rows; }
  int64_t MemoryBytes() const override { return static_cast<int64_t>(layout_.total_bytes()); }

  absl::Status Lookup(absl::Span<const int64_t> ids, absl::Span<const int32_t> offsets,
                      absl::Span<const float> weights, v1::Pooling pooling, float* out,
                      bool insert_missing) override;
  absl::Status ApplyUniqueGradients(absl::Span<const int64_t> ids, const float* grads,
                                    int64_t step) override;
  absl::Status ApplyPooledGradients(absl::Span<const int64_t> ids,
                                    absl::Span<const int32_t> offsets,
                                    absl::Span<const float> weights, v1::Pooling pooling,
                                    const float* bag_grads, int64_t step) override;
  absl::Status ForEachRow(const EmbeddingTable::RowFn& fn) const override;
  absl::Status PutRows(absl::Span<const int64_t> ids, const float* weights, const float* state,
                       absl::Span<const RowMeta> metas) override;

 private:
  const TableView& view() const { return layout_.view; }
  std::string where() const { return absl::StrCat("table '", config_.name(), "'"); }
  // Copies ids in and deduplicates them: unique_, inverse_ and the runs; returns how many
  // distinct ids.
  absl::StatusOr<int32_t> Deduplicate(absl::Span<const int64_t> ids);
  // Slots of the n distinct ids in unique_ (created when insert, after the room check).
  absl::Status Slots(int32_t n, bool insert);
  // Applies the n rows of gradients at grads_ to the rows of unique_'s slots.
  absl::Status ApplySlots(int32_t n, int64_t step);
  template <typename T>
  absl::Status CopyIn(DeviceBuffer& to, const T* from, size_t count);
  absl::Status Sync() {
    TESSERA_CUDA_RETURN(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  v1::TableConfig config_;
  TableLayout layout_;
  int device_;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer keys_, weights_, state_, update_count_, last_step_, rows_;
  // Per call, grown as needed.
  DeviceBuffer ids_, sorted_ids_, iota_, unique_, num_unique_, inverse_, sorted_pos_, run_begin_,
      run_count_, temp_, slots_, gathered_, out_, offsets_, pool_weights_, bag_of_, bag_grads_,
      grads_, flags_;
};

template <typename T>
absl::Status CudaDeviceTable::CopyIn(DeviceBuffer& to, const T* from, size_t count) {
  TESSERA_RETURN_IF_ERROR(to.Reserve(std::max<size_t>(1, count) * sizeof(T)));
  if (count == 0) return absl::OkStatus();
  TESSERA_CUDA_RETURN(
      cudaMemcpyAsync(to.as<T>(), from, count * sizeof(T), cudaMemcpyHostToDevice, stream_));
  return absl::OkStatus();
}

absl::Status CudaDeviceTable::Init() {
  TESSERA_CUDA_RETURN(cudaSetDevice(device_));
  TESSERA_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  size_t free_bytes = 0, total = 0;
  TESSERA_CUDA_RETURN(cudaMemGetInfo(&free_bytes, &total));
  if (layout_.total_bytes() > free_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(where(), ": ", layout_.max_rows, " rows need ", layout_.total_bytes(),
                     " bytes of GPU memory, device ", device_, " has ", free_bytes,
                     " free; lower max_rows or place the table on the host"));
  }
  TESSERA_RETURN_IF_ERROR(keys_.Reserve(layout_.key_bytes()));
  TESSERA_RETURN_IF_ERROR(weights_.Reserve(std::max<uint64_t>(1, layout_.weights_bytes())));
  TESSERA_RETURN_IF_ERROR(state_.Reserve(std::max<uint64_t>(1, layout_.state_bytes())));
  TESSERA_RETURN_IF_ERROR(update_count_.Reserve(layout_.counter_bytes()));
  TESSERA_RETURN_IF_ERROR(last_step_.Reserve(layout_.counter_bytes()));
  TESSERA_RETURN_IF_ERROR(rows_.Reserve(sizeof(unsigned long long)));
  TESSERA_CUDA_RETURN(cudaMemsetAsync(keys_.as<void>(), 0xff, layout_.key_bytes(), stream_));
  TESSERA_CUDA_RETURN(cudaMemsetAsync(rows_.as<void>(), 0, sizeof(unsigned long long), stream_));
  TableView& v = layout_.view;
  v.keys = keys_.as<uint64_t>();
  v.weights = weights_.as<void>();
  v.state = state_.as<float>();
  v.update_count = update_count_.as<int64_t>();
  v.last_step = last_step_.as<int64_t>();
  v.rows = rows_.as<unsigned long long>();
  return Sync();
}

int64_t CudaDeviceTable::num_rows() const {
  unsigned long long rows = 0;
  cudaMemcpyAsync(&rows, view().rows, sizeof(rows), cudaMemcpyDeviceToHost, stream_);
  cudaStreamSynchronize(stream_);
  return static_cast<int64_t>(rows);
}

absl::StatusOr<int32_t> CudaDeviceTable::Deduplicate(absl::Span<const int64_t> ids) {
  const int32_t n = static_cast<int32_t>(ids.size());
  const size_t m = std::max<size_t>(1, ids.size());
  TESSERA_RETURN_IF_ERROR(CopyIn(ids_, ids.data(), ids.size()));
  TESSERA_RETURN_IF_ERROR(sorted_ids_.Reserve(m * sizeof(int64_t)));
  TESSERA_RETURN_IF_ERROR(unique_.Reserve(m * sizeof(int64_t)));
  for (DeviceBuffer* b : {&iota_, &inverse_, &sorted_pos_, &run_begin_, &run_count_}) {
    TESSERA_RETURN_IF_ERROR(b->Reserve(m * sizeof(int32_t)));
  }
  TESSERA_RETURN_IF_ERROR(num_unique_.Reserve(sizeof(int32_t)));
  const size_t temp_bytes = kernels::DedupTempBytes(n);
  TESSERA_RETURN_IF_ERROR(temp_.Reserve(std::max<size_t>(1, temp_bytes)));
  if (n == 0) return 0;
  TESSERA_CUDA_RETURN(
      kernels::Dedup(ids_.as<int64_t>(), n, sorted_ids_.as<int64_t>(), iota_.as<int32_t>(),
                     unique_.as<int64_t>(), num_unique_.as<int32_t>(), inverse_.as<int32_t>(),
                     sorted_pos_.as<int32_t>(), run_begin_.as<int32_t>(), run_count_.as<int32_t>(),
                     temp_.as<void>(), temp_.bytes(), stream_));
  int32_t unique = 0;
  TESSERA_CUDA_RETURN(cudaMemcpyAsync(&unique, num_unique_.as<int32_t>(), sizeof(unique),
                                      cudaMemcpyDeviceToHost, stream_));
  TESSERA_CUDA_RETURN(cudaStreamSynchronize(stream_));
  return unique;
}

absl::Status CudaDeviceTable::Slots(int32_t n, bool insert) {
  TESSERA_RETURN_IF_ERROR(slots_.Reserve(std::max<size_t>(1, n) * sizeof(int64_t)));
  TESSERA_RETURN_IF_ERROR(flags_.Reserve(4 * sizeof(unsigned long long)));
  if (n == 0) return absl::OkStatus();
  auto* missing = flags_.as<unsigned long long>();
  auto* full = reinterpret_cast<int*>(flags_.as<unsigned long long>() + 1);
  TESSERA_CUDA_RETURN(cudaMemsetAsync(flags_.as<void>(), 0, flags_.bytes(), stream_));
  if (insert) {
    // Room for every missing row first: a full table creates none of them.
    TESSERA_CUDA_RETURN(kernels::CountMissing(view(), unique_.as<int64_t>(), n, missing, stream_));
    unsigned long long new_rows = 0;
    TESSERA_CUDA_RETURN(
        cudaMemcpyAsync(&new_rows, missing, sizeof(new_rows), cudaMemcpyDeviceToHost, stream_));
    TESSERA_CUDA_RETURN(cudaStreamSynchronize(stream_));
    const int64_t rows = num_rows();
    if (new_rows > 0 && rows + static_cast<int64_t>(new_rows) > layout_.max_rows) {
      return absl::ResourceExhaustedError(
          absl::StrCat(where(), " is full on the device: ", rows, " rows of ", layout_.max_rows,
                       " (max_rows), ", new_rows,
                       " new ones asked for; raise max_rows or place the table "
                       "on the host"));
    }
  }
  TESSERA_CUDA_RETURN(kernels::FindOrClaim(view(), unique_.as<int64_t>(), n, insert,
                                           slots_.as<int64_t>(), full, stream_));
  int full_host = 0;
  TESSERA_CUDA_RETURN(
      cudaMemcpyAsync(&full_host, full, sizeof(int), cudaMemcpyDeviceToHost, stream_));
  TESSERA_CUDA_RETURN(cudaStreamSynchronize(stream_));
  if (full_host != 0) {
    return absl::InternalError(absl::StrCat(where(),
                                            ": the device map ran out of slots below "
                                            "max_rows (a bug: slots are sized for it)"));
  }
  return absl::OkStatus();
}

absl::Status CudaDeviceTable::Lookup(absl::Span<const int64_t> ids,
                                     absl::Span<const int32_t> offsets,
                                     absl::Span<const float> weights, v1::Pooling pooling,
                                     float* out, bool insert_missing) {
  TESSERA_ASSIGN_OR_RETURN(const size_t out_rows,
                           CheckLookupShape(where(), ids.size(), offsets, weights));
  TESSERA_CUDA_RETURN(cudaSetDevice(device_));
  TESSERA_ASSIGN_OR_RETURN(const int32_t n, Deduplicate(ids));
  TESSERA_RETURN_IF_ERROR(Slots(n, insert_missing));
  const int dim = view().dim;
  TESSERA_RETURN_IF_ERROR(gathered_.Reserve(std::max<size_t>(1, n) * dim * sizeof(float)));
  TESSERA_RETURN_IF_ERROR(out_.Reserve(std::max<size_t>(1, out_rows) * dim * sizeof(float)));
  if (n > 0) {
    TESSERA_CUDA_RETURN(kernels::Gather(view(), unique_.as<int64_t>(), slots_.as<int64_t>(), n,
                                        gathered_.as<float>(), stream_));
  }
  if (offsets.empty()) {
    TESSERA_CUDA_RETURN(kernels::Scatter(gathered_.as<float>(), dim, inverse_.as<int32_t>(),
                                         static_cast<int32_t>(ids.size()), out_.as<float>(),
                                         stream_));
  } else {
    TESSERA_RETURN_IF_ERROR(CopyIn(offsets_, offsets.data(), offsets.size()));
    TESSERA_RETURN_IF_ERROR(CopyIn(pool_weights_, weights.data(), weights.size()));
    TESSERA_CUDA_RETURN(
        kernels::Pool(gathered_.as<float>(), dim, inverse_.as<int32_t>(), offsets_.as<int32_t>(),
                      weights.empty() ? nullptr : pool_weights_.as<float>(), PoolingKindOf(pooling),
                      static_cast<int32_t>(out_rows), out_.as<float>(), stream_));
  }
  TESSERA_CUDA_RETURN(cudaMemcpyAsync(out, out_.as<float>(), out_rows * dim * sizeof(float),
                                      cudaMemcpyDeviceToHost, stream_));
  TESSERA_CUDA_RETURN(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaDeviceTable::ApplySlots(int32_t n, int64_t step) {
  const int dim = view().dim;
  auto* bad = reinterpret_cast<int*>(flags_.as<unsigned long long>() + 1);
  TESSERA_CUDA_RETURN(cudaMemsetAsync(flags_.as<void>(), 0, flags_.bytes(), stream_));
  TESSERA_CUDA_RETURN(
      kernels::FindNonFinite(grads_.as<float>(), static_cast<size_t>(n) * dim, bad, stream_));
  int bad_host = 0;
  TESSERA_CUDA_RETURN(
      cudaMemcpyAsync(&bad_host, bad, sizeof(int), cudaMemcpyDeviceToHost, stream_));
  TESSERA_CUDA_RETURN(cudaStreamSynchronize(stream_));
  if (bad_host != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where(), ": a summed gradient is not finite (NaN or Inf); nothing was applied"));
  }
  TESSERA_RETURN_IF_ERROR(Slots(n, /*insert=*/true));
  auto* refused = flags_.as<unsigned long long>() + 2;
  auto* refused_id = reinterpret_cast<long long*>(flags_.as<unsigned long long>() + 3);
  TESSERA_CUDA_RETURN(kernels::Update(view(), unique_.as<int64_t>(), slots_.as<int64_t>(),
                                      grads_.as<float>(), n, step, refused, refused_id, stream_));
  unsigned long long counts[2] = {0, 0};
  TESSERA_CUDA_RETURN(
      cudaMemcpyAsync(counts, refused, sizeof(counts), cudaMemcpyDeviceToHost, stream_));
  TESSERA_CUDA_RETURN(cudaStreamSynchronize(stream_));
  if (counts[0] == 0) return absl::OkStatus();
  return PartlyApplied(absl::InvalidArgumentError(absl::StrCat(
      where(), ": the update of ", counts[0], " row(s) (id ", static_cast<long long>(counts[1]),
      " among them) would make weights or optimizer state non-finite, so they keep their "
      "values (the other rows of the push are updated); lower the learning rate or clip "
      "gradients (clip_norm, clip_value)")));
}

absl::Status CudaDeviceTable::ApplyUniqueGradients(absl::Span<const int64_t> ids,
                                                   const float* grads, int64_t step) {
  TESSERA_RETURN_IF_ERROR(CheckFiniteGradients(config_.name(), ids, grads, view().dim));
  TESSERA_CUDA_RETURN(cudaSetDevice(device_));
  const int32_t n = static_cast<int32_t>(ids.size());
  TESSERA_RETURN_IF_ERROR(CopyIn(unique_, ids.data(), ids.size()));
  TESSERA_RETURN_IF_ERROR(CopyIn(grads_, grads, ids.size() * view().dim));
  TESSERA_RETURN_IF_ERROR(flags_.Reserve(4 * sizeof(unsigned long long)));
  if (n == 0) return absl::OkStatus();
  return ApplySlots(n, step);
}

absl::Status CudaDeviceTable::ApplyPooledGradients(absl::Span<const int64_t> ids,
                                                   absl::Span<const int32_t> offsets,
                                                   absl::Span<const float> weights,
                                                   v1::Pooling pooling, const float* bag_grads,
                                                   int64_t step) {
  if (offsets.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where(), ": pooled gradients need bag offsets"));
  }
  TESSERA_ASSIGN_OR_RETURN(const size_t bags,
                           CheckLookupShape(where(), ids.size(), offsets, weights));
  TESSERA_CUDA_RETURN(cudaSetDevice(device_));
  const int dim = view().dim;
  TESSERA_ASSIGN_OR_RETURN(const int32_t n, Deduplicate(ids));
  TESSERA_RETURN_IF_ERROR(flags_.Reserve(4 * sizeof(unsigned long long)));
  if (n == 0) return absl::OkStatus();
  TESSERA_RETURN_IF_ERROR(CopyIn(offsets_, offsets.data(), offsets.size()));
  TESSERA_RETURN_IF_ERROR(CopyIn(pool_weights_, weights.data(), weights.size()));
  TESSERA_RETURN_IF_ERROR(CopyIn(bag_grads_, bag_grads, bags * dim));
  TESSERA_RETURN_IF_ERROR(bag_of_.Reserve(std::max<size_t>(1, ids.size()) * sizeof(int32_t)));
  TESSERA_RETURN_IF_ERROR(grads_.Reserve(static_cast<size_t>(n) * dim * sizeof(float)));
  TESSERA_CUDA_RETURN(kernels::BagOf(offsets_.as<int32_t>(), static_cast<int32_t>(bags),
                                     bag_of_.as<int32_t>(), stream_));
  TESSERA_CUDA_RETURN(kernels::PoolBackward(bag_grads_.as<float>(), dim, sorted_pos_.as<int32_t>(),
                                            run_begin_.as<int32_t>(), run_count_.as<int32_t>(), n,
                                            bag_of_.as<int32_t>(), offsets_.as<int32_t>(),
                                            weights.empty() ? nullptr : pool_weights_.as<float>(),
                                            PoolingKindOf(pooling), grads_.as<float>(), stream_));
  return ApplySlots(n, step);
}

absl::Status CudaDeviceTable::ForEachRow(const EmbeddingTable::RowFn& fn) const {
  constexpr int32_t kChunk = 1 << 16;
  const int dim = view().dim;
  const int sf = view().state_floats;
  DeviceBuffer ids, weights, state, counts, steps, used;
  TESSERA_RETURN_IF_ERROR(ids.Reserve(kChunk * sizeof(int64_t)));
  TESSERA_RETURN_IF_ERROR(weights.Reserve(static_cast<size_t>(kChunk) * dim * sizeof(float)));
  TESSERA_RETURN_IF_ERROR(
      state.Reserve(std::max<size_t>(1, static_cast<size_t>(kChunk) * sf) * sizeof(float)));
  TESSERA_RETURN_IF_ERROR(counts.Reserve(kChunk * sizeof(int64_t)));
  TESSERA_RETURN_IF_ERROR(steps.Reserve(kChunk * sizeof(int64_t)));
  TESSERA_RETURN_IF_ERROR(used.Reserve(kChunk));
  std::vector<int64_t> h_ids(kChunk), h_counts(kChunk), h_steps(kChunk);
  std::vector<float> h_weights(static_cast<size_t>(kChunk) * dim),
      h_state(static_cast<size_t>(kChunk) * sf);
  std::vector<uint8_t> h_used(kChunk);
  const uint64_t total = view().slots + 1;
  for (uint64_t first = 0; first < total; first += kChunk) {
    const int32_t n = static_cast<int32_t>(std::min<uint64_t>(kChunk, total - first));
    TESSERA_CUDA_RETURN(kernels::Export(view(), first, n, ids.as<int64_t>(), weights.as<float>(),
                                        state.as<float>(), counts.as<int64_t>(),
                                        steps.as<int64_t>(), used.as<uint8_t>(), stream_));
    auto copy = [&](void* to, const DeviceBuffer& from, size_t bytes) {
      return cudaMemcpyAsync(to, from.as<void>(), bytes, cudaMemcpyDeviceToHost, stream_);
    };
    TESSERA_CUDA_RETURN(copy(h_used.data(), used, n));
    TESSERA_CUDA_RETURN(copy(h_ids.data(), ids, n * sizeof(int64_t)));
    TESSERA_CUDA_RETURN(copy(h_weights.data(), weights, static_cast<size_t>(n) * dim * 4));
    if (sf > 0) TESSERA_CUDA_RETURN(copy(h_state.data(), state, static_cast<size_t>(n) * sf * 4));
    TESSERA_CUDA_RETURN(copy(h_counts.data(), counts, n * sizeof(int64_t)));
    TESSERA_CUDA_RETURN(copy(h_steps.data(), steps, n * sizeof(int64_t)));
    TESSERA_CUDA_RETURN(cudaStreamSynchronize(stream_));
    for (int32_t i = 0; i < n; ++i) {
      if (h_used[i] == 0) continue;
      RowMeta meta;
      meta.update_count = h_counts[i];
      meta.last_step = h_steps[i];
      fn(h_ids[i], h_weights.data() + static_cast<size_t>(i) * dim,
         h_state.data() + static_cast<size_t>(i) * sf, meta);
    }
  }
  return absl::OkStatus();
}

absl::Status CudaDeviceTable::PutRows(absl::Span<const int64_t> ids, const float* weights,
                                      const float* state, absl::Span<const RowMeta> metas) {
  if (metas.size() != ids.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where(), ": ", metas.size(), " row metas for ", ids.size(), " rows"));
  }
  TESSERA_CUDA_RETURN(cudaSetDevice(device_));
  // Room first, counting only ids without a row.
  TESSERA_ASSIGN_OR_RETURN(const int32_t n, Deduplicate(ids));
  if (n != static_cast<int32_t>(ids.size())) {
    return absl::InvalidArgumentError(absl::StrCat(where(), ": rows to put repeat an id"));
  }
  TESSERA_RETURN_IF_ERROR(flags_.Reserve(4 * sizeof(unsigned long long)));
  if (n == 0) return absl::OkStatus();
  TESSERA_CUDA_RETURN(cudaMemsetAsync(flags_.as<void>(), 0, flags_.bytes(), stream_));
  auto* missing = flags_.as<unsigned long long>();
  TESSERA_CUDA_RETURN(kernels::CountMissing(view(), unique_.as<int64_t>(), n, missing, stream_));
  unsigned long long new_rows = 0;
  TESSERA_CUDA_RETURN(
      cudaMemcpyAsync(&new_rows, missing, sizeof(new_rows), cudaMemcpyDeviceToHost, stream_));
  TESSERA_CUDA_RETURN(cudaStreamSynchronize(stream_));
  if (num_rows() + static_cast<int64_t>(new_rows) > layout_.max_rows) {
    return absl::ResourceExhaustedError(absl::StrCat(where(), ": ", new_rows,
                                                     " new rows would pass max_rows ",
                                                     layout_.max_rows, " on the device"));
  }
  std::vector<int64_t> counts(ids.size()), steps(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    counts[i] = metas[i].update_count;
    steps[i] = metas[i].last_step;
  }
  DeviceBuffer d_weights, d_state, d_counts, d_steps;
  TESSERA_RETURN_IF_ERROR(CopyIn(d_weights, weights, ids.size() * view().dim));
  TESSERA_RETURN_IF_ERROR(CopyIn(d_state, state, ids.size() * view().state_floats));
  TESSERA_RETURN_IF_ERROR(CopyIn(d_counts, counts.data(), counts.size()));
  TESSERA_RETURN_IF_ERROR(CopyIn(d_steps, steps.data(), steps.size()));
  TESSERA_RETURN_IF_ERROR(CopyIn(ids_, ids.data(), ids.size()));
  auto* full = reinterpret_cast<int*>(flags_.as<unsigned long long>() + 1);
  TESSERA_CUDA_RETURN(kernels::Import(view(), ids_.as<int64_t>(), d_weights.as<float>(),
                                      d_state.as<float>(), d_counts.as<int64_t>(),
                                      d_steps.as<int64_t>(), n, full, stream_));
  TESSERA_CUDA_RETURN(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

}  // namespace

absl::Status DeviceTable::Usable(int device) { return CheckDevice(device); }

absl::StatusOr<std::unique_ptr<DeviceTable>> DeviceTable::Create(const v1::TableConfig& config,
                                                                 int device) {
  TESSERA_ASSIGN_OR_RETURN(const TableLayout layout, DescribeTable(config));
  TESSERA_RETURN_IF_ERROR(CheckDevice(device));
  auto table = std::make_unique<CudaDeviceTable>(config, layout, device);
  TESSERA_RETURN_IF_ERROR(table->Init());
  return std::unique_ptr<DeviceTable>(std::move(table));
}

}  // namespace tessera::embedding::device
