#ifndef TESSERA_EMBEDDING_DEVICE_DEVICE_TABLE_KERNELS_H_
#define TESSERA_EMBEDDING_DEVICE_DEVICE_TABLE_KERNELS_H_

// The device table's kernels and CUB calls, launched on a stream; each returns the CUDA
// error of its launch. Plain C++ over device pointers (no absl): device_table_cuda.cc
// drives them. Every thread runs table_core.h's code for its id, row or element.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "embedding/device/table_core.h"

namespace tessera::embedding::device::kernels {

// The distinct ids of ids (n) in ascending order and, for each, the positions holding it
// in ascending order: unique (n), num_unique (1, on the device), inverse (n: each id's
// place in unique), sorted_pos (n: positions grouped by id), run_begin and run_count (n:
// each distinct id's range of sorted_pos). `temp` of DedupTempBytes(n) bytes.
size_t DedupTempBytes(int32_t n);
cudaError_t Dedup(const int64_t* ids, int32_t n, int64_t* sorted_ids, int32_t* iota,
                  int64_t* unique, int32_t* num_unique, int32_t* inverse, int32_t* sorted_pos,
                  int32_t* run_begin, int32_t* run_count, void* temp, size_t temp_bytes,
                  cudaStream_t stream);

// How many of unique (n) have no row: added to *missing.
cudaError_t CountMissing(const TableView& t, const int64_t* unique, int32_t n,
                         unsigned long long* missing, cudaStream_t stream);

// slots (n) of unique (n): claimed and filled when missing and `insert`, else -1 for a
// missing id; *full set to 1 when a claim found no free slot.
cudaError_t FindOrClaim(const TableView& t, const int64_t* unique, int32_t n, bool insert,
                        int64_t* slots, int* full, cudaStream_t stream);

// rows (n, dim): the weights of each slot, or the initial weights of unique[u] for -1.
cudaError_t Gather(const TableView& t, const int64_t* unique, const int64_t* slots, int32_t n,
                   float* rows, cudaStream_t stream);

// out (n_ids, dim): rows[inverse[i]] for each id i.
cudaError_t Scatter(const float* rows, int dim, const int32_t* inverse, int32_t n_ids, float* out,
                    cudaStream_t stream);

// out (bags, dim): table_core's PoolColumn of each bag; weights may be null.
cudaError_t Pool(const float* rows, int dim, const int32_t* inverse, const int32_t* offsets,
                 const float* weights, row_math::PoolingKind pooling, int32_t bags, float* out,
                 cudaStream_t stream);

// bag_of (offsets[bags]): each position's bag.
cudaError_t BagOf(const int32_t* offsets, int32_t bags, int32_t* bag_of, cudaStream_t stream);

// unique_grads (n_unique, dim): table_core's UniqueGradColumn of each distinct id.
cudaError_t PoolBackward(const float* bag_grads, int dim, const int32_t* sorted_pos,
                         const int32_t* run_begin, const int32_t* run_count, int32_t n_unique,
                         const int32_t* bag_of, const int32_t* offsets, const float* weights,
                         row_math::PoolingKind pooling, float* unique_grads, cudaStream_t stream);

// *bad set to 1 when a value of values (n) is not finite.
cudaError_t FindNonFinite(const float* values, size_t n, int* bad, cudaStream_t stream);

// table_core's UpdateRow of each row; *refused counts the rows that kept their values,
// *refused_id one of their ids.
cudaError_t Update(const TableView& t, const int64_t* ids, const int64_t* slots, const float* grads,
                   int32_t n, int64_t step, unsigned long long* refused, long long* refused_id,
                   cudaStream_t stream);

// table_core's ImportRow of each row; *full set to 1 when one found no slot.
cudaError_t Import(const TableView& t, const int64_t* ids, const float* weights, const float* state,
                   const int64_t* update_count, const int64_t* last_step, int32_t n, int* full,
                   cudaStream_t stream);

// table_core's ExportRow of slots [first, first + n): used (n) says which hold a row, and
// for those ids (n), weights (n, dim), state (n, state floats) and counters (n each).
cudaError_t Export(const TableView& t, uint64_t first, int32_t n, int64_t* ids, float* weights,
                   float* state, int64_t* update_count, int64_t* last_step, uint8_t* used,
                   cudaStream_t stream);

// The ceiling the benchmarks compare with: out (n, dim) gets rows rows[i] of a flat fp32
// array (any, dim), no map in between.
cudaError_t FlatGather(const float* table, int dim, const int64_t* rows, int32_t n, float* out,
                       cudaStream_t stream);

}  // namespace tessera::embedding::device::kernels

#endif  // TESSERA_EMBEDDING_DEVICE_DEVICE_TABLE_KERNELS_H_
