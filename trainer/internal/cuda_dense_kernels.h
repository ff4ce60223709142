#ifndef TESSERA_TRAINER_INTERNAL_CUDA_DENSE_KERNELS_H_
#define TESSERA_TRAINER_INTERNAL_CUDA_DENSE_KERNELS_H_

// The CUDA backend's own kernels (cuBLAS does the GEMMs): bias and ReLU, the DLRM
// interaction's gather and scatter, the loss, and the optimizers. Plain C++ with the CUDA
// runtime's types, so the backend itself compiles with the host compiler. Each launcher
// queues its work on `stream` and returns the launch's error.
//
// Layouts (column-major, one sample per column, as the CPU backend): activations
// (features, batch); T, the interaction's vectors of sample b, (d, f1) at T + b d f1 with
// column 0 the bottom MLP's output and column i the pooled embedding of feature i - 1;
// embeddings and their gradients (num_sparse, batch, d) row-major as DenseBackend takes
// them.

#include <cuda_runtime.h>

namespace tessera::trainer_internal::cuda {

// h(o, b) += bias(o), then max(h, 0) when `relu`.
cudaError_t BiasRelu(float* h, const float* bias, int out, int batch, bool relu,
                     cudaStream_t stream);

// delta(o, b) *= h(o, b) > 0.
cudaError_t ReluBackward(float* delta, const float* h, int n, cudaStream_t stream);

// T from z0 (d, batch) and the embeddings.
cudaError_t GatherInteraction(const float* z0, const float* embeddings, float* t, int d,
                              int num_sparse, int batch, cudaStream_t stream);

// top_in (d + pairs, batch): z0 on top, then gram_b(i, j) for i = 1..f1-1, j < i.
cudaError_t BuildTopInput(const float* z0, const float* gram, float* top_in, int d, int f1,
                          int batch, cudaStream_t stream);

// S_b (f1, f1), symmetric with a zero diagonal: S(i, j) = S(j, i) = d_top_in's pair (i, j).
cudaError_t PairGradToSymmetric(const float* d_top_in, float* s, int d, int f1, int batch,
                                cudaStream_t stream);

// d_z0(k, b) = d_top_in(k, b) + dT_b(k, 0); embedding_grads(f, b, k) = dT_b(k, f + 1).
cudaError_t ScatterInteractionGrad(const float* d_top_in, const float* dt, float* d_z0,
                                   float* embedding_grads, int d, int f1, int batch,
                                   cudaStream_t stream);

// Per sample: loss(b) = max(x, 0) - x y + log1p(exp(-|x|)) and delta(b) = (sigmoid(x) - y)
// / batch, for the logit x and label y.
cudaError_t LossAndDelta(const float* logits, const float* labels, float* loss, float* delta,
                         int batch, cudaStream_t stream);

// p -= lr g.
cudaError_t SgdStep(float* p, const float* g, size_t n, float lr, cudaStream_t stream);

// Adam with bias corrections c1 = 1 - b1^t, c2 = 1 - b2^t.
cudaError_t AdamStep(float* p, float* m, float* v, const float* g, size_t n, float lr, float b1,
                     float b2, float eps, float c1, float c2, cudaStream_t stream);

// x[i] = value.
cudaError_t Fill(float* x, size_t n, float value, cudaStream_t stream);

}  // namespace tessera::trainer_internal::cuda

#endif  // TESSERA_TRAINER_INTERNAL_CUDA_DENSE_KERNELS_H_
