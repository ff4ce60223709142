// The device table's kernels; see device_table_kernels.h. Each thread runs table_core.h's
// code for one id, row or element, in grid-stride loops. Built with --fmad=false, so
// products and sums round as the host's do (the rows then match the host table's bits
// wherever the math library does).

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include "base/cuda_grid.cuh"
#include "embedding/device/device_table_kernels.h"

namespace tessera::embedding::device::kernels {
namespace {

using base::GridBlocks;
using base::kGridThreads;

constexpr int kMaxDim = 256;  // table_layout.h's kMaxDeviceDim

__global__ void IotaKernel(int32_t* out, int32_t n) {
  TESSERA_GRID_LOOP(i, static_cast<size_t>(n)) out[i] = static_cast<int32_t>(i);
}

__global__ void InverseKernel(const int32_t* num_unique, const int32_t* sorted_pos,
                              const int32_t* run_begin, const int32_t* run_count,
                              int32_t* inverse) {
  TESSERA_GRID_LOOP(u, static_cast<size_t>(*num_unique)) {
    for (int32_t c = 0; c < run_count[u]; ++c) {
      inverse[sorted_pos[run_begin[u] + c]] = static_cast<int32_t>(u);
    }
  }
}

__global__ void CountMissingKernel(TableView t, const int64_t* unique, int32_t n,
                                   unsigned long long* missing) {
  TESSERA_GRID_LOOP(u, static_cast<size_t>(n)) {
    if (FindSlot(t, unique[u]) < 0) atomicAdd(missing, 1ULL);
  }
}

__global__ void FindOrClaimKernel(TableView t, const int64_t* unique, int32_t n, bool insert,
                                  int64_t* slots, int* full) {
  float scratch[kMaxDim];
  TESSERA_GRID_LOOP(u, static_cast<size_t>(n)) {
    int64_t slot = FindSlot(t, unique[u]);
    if (slot < 0 && insert) {
      bool created = false;
      slot = ClaimSlot(t, unique[u], &created);
      if (slot < 0) {
        atomicExch(full, 1);
      } else if (created) {
        InitRow(t, slot, unique[u], scratch);
      }
    }
    slots[u] = slot;
  }
}

__global__ void GatherKernel(TableView t, const int64_t* unique, const int64_t* slots, int32_t n,
                             float* rows) {
  TESSERA_GRID_LOOP(u, static_cast<size_t>(n)) {
    float* out = rows + u * t.dim;
    if (slots[u] >= 0) {
      ReadWeights(t, slots[u], out);
    } else {
      InitialWeights(t, unique[u], out);
    }
  }
}

__global__ void ScatterKernel(const float* rows, int dim, const int32_t* inverse, int32_t n_ids,
                              float* out) {
  TESSERA_GRID_LOOP(x, static_cast<size_t>(n_ids) * dim) {
    const size_t i = x / dim;
    const int j = static_cast<int>(x % dim);
    out[x] = rows[static_cast<size_t>(inverse[i]) * dim + j];
  }
}

__global__ void PoolKernel(const float* rows, int dim, const int32_t* inverse,
                           const int32_t* offsets, const float* weights,
                           row_math::PoolingKind pooling, int32_t bags, float* out) {
  TESSERA_GRID_LOOP(x, static_cast<size_t>(bags) * dim) {
    out[x] = PoolColumn(rows, dim, inverse, offsets, weights, pooling,
                        static_cast<int64_t>(x / dim), static_cast<int>(x % dim));
  }
}

__global__ void BagOfKernel(const int32_t* offsets, int32_t bags, int32_t* bag_of) {
  TESSERA_GRID_LOOP(b, static_cast<size_t>(bags)) {
    for (int32_t k = offsets[b]; k < offsets[b + 1]; ++k) bag_of[k] = static_cast<int32_t>(b);
  }
}

__global__ void PoolBackwardKernel(const float* bag_grads, int dim, const int32_t* sorted_pos,
                                   const int32_t* run_begin, const int32_t* run_count,
                                   int32_t n_unique, const int32_t* bag_of, const int32_t* offsets,
                                   const float* weights, row_math::PoolingKind pooling,
                                   float* unique_grads) {
  TESSERA_GRID_LOOP(x, static_cast<size_t>(n_unique) * dim) {
    const size_t u = x / dim;
    unique_grads[x] =
        UniqueGradColumn(bag_grads, dim, sorted_pos + run_begin[u], run_count[u], bag_of, offsets,
                         weights, pooling, static_cast<int>(x % dim));
  }
}

__global__ void NonFiniteKernel(const float* values, size_t n, int* bad) {
  TESSERA_GRID_LOOP(i, n) {
    if (!row_math::Finite(values[i])) atomicExch(bad, 1);
  }
}

__global__ void UpdateKernel(TableView t, const int64_t* ids, const int64_t* slots,
                             const float* grads, int32_t n, int64_t step,
                             unsigned long long* refused, long long* refused_id) {
  float scratch[4 * kMaxDim];  // weights, gradient, state (at most 2 * dim)
  TESSERA_GRID_LOOP(u, static_cast<size_t>(n)) {
    if (!UpdateRow(t, slots[u], ids[u], grads + u * t.dim, step, scratch)) {
      atomicAdd(refused, 1ULL);
      atomicExch(reinterpret_cast<unsigned long long*>(refused_id),
                 static_cast<unsigned long long>(ids[u]));
    }
  }
}

__global__ void ImportKernel(TableView t, const int64_t* ids, const float* weights,
                             const float* state, const int64_t* update_count,
                             const int64_t* last_step, int32_t n, int* full) {
  TESSERA_GRID_LOOP(i, static_cast<size_t>(n)) {
    if (!ImportRow(t, ids[i], weights + i * t.dim, state + i * t.state_floats, update_count[i],
                   last_step[i])) {
      atomicExch(full, 1);
    }
  }
}

__global__ void ExportKernel(TableView t, uint64_t first, int32_t n, int64_t* ids, float* weights,
                             float* state, int64_t* update_count, int64_t* last_step,
                             uint8_t* used) {
  TESSERA_GRID_LOOP(i, static_cast<size_t>(n)) {
    const uint64_t slot = first + i;
    const uint64_t key = t.keys[slot];
    used[i] = key != kEmptyKey;
    if (!used[i]) continue;
    // The last slot is id -1's, its key 0 when taken.
    ids[i] = slot == t.slots ? -1 : static_cast<int64_t>(key);
    ExportRow(t, static_cast<int64_t>(slot), weights + i * t.dim, state + i * t.state_floats,
              update_count + i, last_step + i);
  }
}

__global__ void FlatGatherKernel(const float* table, int dim, const int64_t* rows, int32_t n,
                                 float* out) {
  TESSERA_GRID_LOOP(x, static_cast<size_t>(n) * dim) {
    out[x] = table[static_cast<size_t>(rows[x / dim]) * dim + x % dim];
  }
}

}  // namespace

size_t DedupTempBytes(int32_t n) {
  size_t sort = 0, encode = 0, scan = 0;
  cub::DeviceRadixSort::SortPairs(
      nullptr, sort, static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n);
  cub::DeviceRunLengthEncode::Encode(nullptr, encode, static_cast<const int64_t*>(nullptr),
                                     static_cast<int64_t*>(nullptr), static_cast<int32_t*>(nullptr),
                                     static_cast<int32_t*>(nullptr), n);
  cub::DeviceScan::ExclusiveSum(nullptr, scan, static_cast<const int32_t*>(nullptr),
                                static_cast<int32_t*>(nullptr), n);
  size_t most = sort > encode ? sort : encode;
  return most > scan ? most : scan;
}

cudaError_t Dedup(const int64_t* ids, int32_t n, int64_t* sorted_ids, int32_t* iota,
                  int64_t* unique, int32_t* num_unique, int32_t* inverse, int32_t* sorted_pos,
                  int32_t* run_begin, int32_t* run_count, void* temp, size_t temp_bytes,
                  cudaStream_t stream) {
  IotaKernel<<<GridBlocks(n), kGridThreads, 0, stream>>>(iota, n);
  // A stable sort: each id's positions stay ascending.
  size_t bytes = temp_bytes;
  cudaError_t e = cub::DeviceRadixSort::SortPairs(temp, bytes, ids, sorted_ids, iota, sorted_pos, n,
                                                  0, 64, stream);
  if (e != cudaSuccess) return e;
  cudaMemsetAsync(run_count, 0, sizeof(int32_t) * n, stream);
  bytes = temp_bytes;
  e = cub::DeviceRunLengthEncode::Encode(temp, bytes, sorted_ids, unique, run_count, num_unique, n,
                                         stream);
  if (e != cudaSuccess) return e;
  bytes = temp_bytes;
  e = cub::DeviceScan::ExclusiveSum(temp, bytes, run_count, run_begin, n, stream);
  if (e != cudaSuccess) return e;
  InverseKernel<<<GridBlocks(n), kGridThreads, 0, stream>>>(num_unique, sorted_pos, run_begin,
                                                            run_count, inverse);
  return cudaGetLastError();
}

cudaError_t CountMissing(const TableView& t, const int64_t* unique, int32_t n,
                         unsigned long long* missing, cudaStream_t stream) {
  CountMissingKernel<<<GridBlocks(n), kGridThreads, 0, stream>>>(t, unique, n, missing);
  return cudaGetLastError();
}

cudaError_t FindOrClaim(const TableView& t, const int64_t* unique, int32_t n, bool insert,
                        int64_t* slots, int* full, cudaStream_t stream) {
  FindOrClaimKernel<<<GridBlocks(n), kGridThreads, 0, stream>>>(t, unique, n, insert, slots, full);
  return cudaGetLastError();
}

cudaError_t Gather(const TableView& t, const int64_t* unique, const int64_t* slots, int32_t n,
                   float* rows, cudaStream_t stream) {
  GatherKernel<<<GridBlocks(n), kGridThreads, 0, stream>>>(t, unique, slots, n, rows);
  return cudaGetLastError();
}

cudaError_t Scatter(const float* rows, int dim, const int32_t* inverse, int32_t n_ids, float* out,
                    cudaStream_t stream) {
  ScatterKernel<<<GridBlocks(static_cast<size_t>(n_ids) * dim), kGridThreads, 0, stream>>>(
      rows, dim, inverse, n_ids, out);
  return cudaGetLastError();
}

cudaError_t Pool(const float* rows, int dim, const int32_t* inverse, const int32_t* offsets,
                 const float* weights, row_math::PoolingKind pooling, int32_t bags, float* out,
                 cudaStream_t stream) {
  PoolKernel<<<GridBlocks(static_cast<size_t>(bags) * dim), kGridThreads, 0, stream>>>(
      rows, dim, inverse, offsets, weights, pooling, bags, out);
  return cudaGetLastError();
}

cudaError_t BagOf(const int32_t* offsets, int32_t bags, int32_t* bag_of, cudaStream_t stream) {
  BagOfKernel<<<GridBlocks(bags), kGridThreads, 0, stream>>>(offsets, bags, bag_of);
  return cudaGetLastError();
}

cudaError_t PoolBackward(const float* bag_grads, int dim, const int32_t* sorted_pos,
                         const int32_t* run_begin, const int32_t* run_count, int32_t n_unique,
                         const int32_t* bag_of, const int32_t* offsets, const float* weights,
                         row_math::PoolingKind pooling, float* unique_grads, cudaStream_t stream) {
  PoolBackwardKernel<<<GridBlocks(static_cast<size_t>(n_unique) * dim), kGridThreads, 0, stream>>>(
      bag_grads, dim, sorted_pos, run_begin, run_count, n_unique, bag_of, offsets, weights, pooling,
      unique_grads);
  return cudaGetLastError();
}

cudaError_t FindNonFinite(const float* values, size_t n, int* bad, cudaStream_t stream) {
  NonFiniteKernel<<<GridBlocks(n), kGridThreads, 0, stream>>>(values, n, bad);
  return cudaGetLastError();
}

cudaError_t Update(const TableView& t, const int64_t* ids, const int64_t* slots, const float* grads,
                   int32_t n, int64_t step, unsigned long long* refused, long long* refused_id,
                   cudaStream_t stream) {
  UpdateKernel<<<GridBlocks(n), kGridThreads, 0, stream>>>(t, ids, slots, grads, n, step, refused,
                                                           refused_id);
  return cudaGetLastError();
}

cudaError_t Import(const TableView& t, const int64_t* ids, const float* weights, const float* state,
                   const int64_t* update_count, const int64_t* last_step, int32_t n, int* full,
                   cudaStream_t stream) {
  ImportKernel<<<GridBlocks(n), kGridThreads, 0, stream>>>(t, ids, weights, state, update_count,
                                                           last_step, n, full);
  return cudaGetLastError();
}

cudaError_t Export(const TableView& t, uint64_t first, int32_t n, int64_t* ids, float* weights,
                   float* state, int64_t* update_count, int64_t* last_step, uint8_t* used,
                   cudaStream_t stream) {
  ExportKernel<<<GridBlocks(n), kGridThreads, 0, stream>>>(t, first, n, ids, weights, state,
                                                           update_count, last_step, used);
  return cudaGetLastError();
}

cudaError_t FlatGather(const float* table, int dim, const int64_t* rows, int32_t n, float* out,
                       cudaStream_t stream) {
  FlatGatherKernel<<<GridBlocks(static_cast<size_t>(n) * dim), kGridThreads, 0, stream>>>(
      table, dim, rows, n, out);
  return cudaGetLastError();
}

}  // namespace tessera::embedding::device::kernels
