// Kernels of the CUDA DenseBackend; see cuda_dense_kernels.h. Each is a grid-stride loop
// over its elements: they are memory-bound and small next to the GEMMs.

#include "base/cuda_grid.cuh"
#include "trainer/internal/cuda_dense_kernels.h"

namespace tessera::trainer_internal::cuda {
namespace {

using base::GridBlocks;
using base::kGridThreads;

__global__ void BiasReluKernel(float* h, const float* bias, int out, size_t n, bool relu) {
  TESSERA_GRID_LOOP(i, n) {
    const float v = h[i] + bias[i % out];
    h[i] = relu ? fmaxf(v, 0.0f) : v;
  }
}

__global__ void ReluBackwardKernel(float* delta, const float* h, size_t n) {
  TESSERA_GRID_LOOP(i, n) {
    if (!(h[i] > 0.0f)) delta[i] = 0.0f;
  }
}

__global__ void GatherInteractionKernel(const float* z0, const float* emb, float* t, int d, int f1,
                                        int batch) {
  const size_t n = static_cast<size_t>(batch) * f1 * d;
  TESSERA_GRID_LOOP(i, n) {
    const int k = static_cast<int>(i % d);
    const int f = static_cast<int>((i / d) % f1);
    const size_t b = i / (static_cast<size_t>(d) * f1);
    t[i] = f == 0 ? z0[b * d + k] : emb[((f - 1) * static_cast<size_t>(batch) + b) * d + k];
  }
}

// Pair p of (i, j), j < i, by i then j: p = i (i - 1) / 2 + j.
__device__ void PairOf(int p, int* i, int* j) {
  int r = static_cast<int>((1.0f + sqrtf(1.0f + 8.0f * p)) / 2.0f);
  while (r * (r - 1) / 2 > p) --r;
  while ((r + 1) * r / 2 <= p) ++r;
  *i = r;
  *j = p - r * (r - 1) / 2;
}

__global__ void BuildTopInputKernel(const float* z0, const float* gram, float* top_in, int d,
                                    int f1, int batch) {
  const int pairs = f1 * (f1 - 1) / 2;
  const int rows = d + pairs;
  const size_t n = static_cast<size_t>(batch) * rows;
  TESSERA_GRID_LOOP(x, n) {
    const int r = static_cast<int>(x % rows);
    const size_t b = x / rows;
    if (r < d) {
      top_in[x] = z0[b * d + r];
    } else {
      int i, j;
      PairOf(r - d, &i, &j);
      top_in[x] = gram[b * f1 * f1 + static_cast<size_t>(j) * f1 + i];
    }
  }
}

__global__ void PairGradToSymmetricKernel(const float* d_top_in, float* s, int d, int f1,
                                          int batch) {
  const int pairs = f1 * (f1 - 1) / 2;
  const size_t n = static_cast<size_t>(batch) * f1 * f1;
  TESSERA_GRID_LOOP(x, n) {
    const int i = static_cast<int>(x % f1);
    const int j = static_cast<int>((x / f1) % f1);
    const size_t b = x / (static_cast<size_t>(f1) * f1);
    float v = 0.0f;
    if (i != j) {
      const int hi = i > j ? i : j;
      const int lo = i > j ? j : i;
      v = d_top_in[b * (d + pairs) + d + hi * (hi - 1) / 2 + lo];
    }
    s[x] = v;
  }
}

__global__ void ScatterInteractionGradKernel(const float* d_top_in, const float* dt, float* d_z0,
                                             float* emb_grads, int d, int f1, int batch) {
  const int pairs = f1 * (f1 - 1) / 2;
  const size_t n = static_cast<size_t>(batch) * f1 * d;
  TESSERA_GRID_LOOP(x, n) {
    const int k = static_cast<int>(x % d);
    const int f = static_cast<int>((x / d) % f1);
    const size_t b = x / (static_cast<size_t>(d) * f1);
    if (f == 0) {
      d_z0[b * d + k] = d_top_in[b * (d + pairs) + k] + dt[x];
    } else {
      emb_grads[((f - 1) * static_cast<size_t>(batch) + b) * d + k] = dt[x];
    }
  }
}

__global__ void LossAndDeltaKernel(const float* logits, const float* labels, float* loss,
                                   float* delta, int batch) {
  TESSERA_GRID_LOOP(b, static_cast<size_t>(batch)) {
    const float x = logits[b];
    const float y = labels[b];
    loss[b] = fmaxf(x, 0.0f) - x * y + log1pf(expf(-fabsf(x)));
    const float p = 1.0f / (1.0f + expf(-x));
    delta[b] = (p - y) / static_cast<float>(batch);
  }
}

__global__ void SgdKernel(float* p, const float* g, size_t n, float lr) {
  TESSERA_GRID_LOOP(i, n) { p[i] -= lr * g[i]; }
}

__global__ void AdamKernel(float* p, float* m, float* v, const float* g, size_t n, float lr,
                           float b1, float b2, float eps, float c1, float c2) {
  TESSERA_GRID_LOOP(i, n) {
    const float gi = g[i];
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= lr * (mi / c1) / (sqrtf(vi / c2) + eps);
  }
}

__global__ void FillKernel(float* x, size_t n, float value) {
  TESSERA_GRID_LOOP(i, n) { x[i] = value; }
}

}  // namespace

cudaError_t BiasRelu(float* h, const float* bias, int out, int batch, bool relu,
                     cudaStream_t stream) {
  const size_t n = static_cast<size_t>(out) * batch;
  BiasReluKernel<<<GridBlocks(n), kGridThreads, 0, stream>>>(h, bias, out, n, relu);
  return cudaGetLastError();
}

cudaError_t ReluBackward(float* delta, const float* h, int n, cudaStream_t stream) {
  ReluBackwardKernel<<<GridBlocks(n), kGridThreads, 0, stream>>>(delta, h, static_cast<size_t>(n));
  return cudaGetLastError();
}

cudaError_t GatherInteraction(const float* z0, const float* embeddings, float* t, int d,
                              int num_sparse, int batch, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(batch) * (num_sparse + 1) * d;
  GatherInteractionKernel<<<GridBlocks(n), kGridThreads, 0, stream>>>(z0, embeddings, t, d,
                                                                      num_sparse + 1, batch);
  return cudaGetLastError();
}

cudaError_t BuildTopInput(const float* z0, const float* gram, float* top_in, int d, int f1,
                          int batch, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(batch) * (d + f1 * (f1 - 1) / 2);
  BuildTopInputKernel<<<GridBlocks(n), kGridThreads, 0, stream>>>(z0, gram, top_in, d, f1, batch);
  return cudaGetLastError();
}

cudaError_t PairGradToSymmetric(const float* d_top_in, float* s, int d, int f1, int batch,
                                cudaStream_t stream) {
  const size_t n = static_cast<size_t>(batch) * f1 * f1;
  PairGradToSymmetricKernel<<<GridBlocks(n), kGridThreads, 0, stream>>>(d_top_in, s, d, f1, batch);
  return cudaGetLastError();
}

cudaError_t ScatterInteractionGrad(const float* d_top_in, const float* dt, float* d_z0,
                                   float* embedding_grads, int d, int f1, int batch,
                                   cudaStream_t stream) {
  const size_t n = static_cast<size_t>(batch) * f1 * d;
  ScatterInteractionGradKernel<<<GridBlocks(n), kGridThreads, 0, stream>>>(
      d_top_in, dt, d_z0, embedding_grads, d, f1, batch);
  return cudaGetLastError();
}

cudaError_t LossAndDelta(const float* logits, const float* labels, float* loss, float* delta,
                         int batch, cudaStream_t stream) {
  LossAndDeltaKernel<<<GridBlocks(batch), kGridThreads, 0, stream>>>(logits, labels, loss, delta,
                                                                     batch);
  return cudaGetLastError();
}

cudaError_t SgdStep(float* p, const float* g, size_t n, float lr, cudaStream_t stream) {
  SgdKernel<<<GridBlocks(n), kGridThreads, 0, stream>>>(p, g, n, lr);
  return cudaGetLastError();
}

cudaError_t AdamStep(float* p, float* m, float* v, const float* g, size_t n, float lr, float b1,
                     float b2, float eps, float c1, float c2, cudaStream_t stream) {
  AdamKernel<<<GridBlocks(n), kGridThreads, 0, stream>>>(p, m, v, g, n, lr, b1, b2, eps, c1, c2);
  return cudaGetLastError();
}

cudaError_t Fill(float* x, size_t n, float value, cudaStream_t stream) {
  FillKernel<<<GridBlocks(n), kGridThreads, 0, stream>>>(x, n, value);
  return cudaGetLastError();
}

}  // namespace tessera::trainer_internal::cuda
