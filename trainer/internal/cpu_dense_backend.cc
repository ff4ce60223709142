// The CPU DenseBackend: DLRM's dense network on Eigen, single-threaded per backend so a
// step is bit-reproducible.

#include <cmath>
#include <cstring>
#include <random>

#include "Eigen/Dense"
#include "absl/strings/str_cat.h"
#include "embedding/storage/crc32c.h"
#include "trainer/dense_backend.h"

namespace tessera::trainer_internal {
namespace {

using trainer::DenseOptimizerType;
using trainer::DlrmConfig;
using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic>;
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<Mat>;
using ConstMatMap = Eigen::Map<const Mat>;
using VecMap = Eigen::Map<Eigen::VectorXf>;

constexpr absl::string_view kStateMagic = "tessera-dense-cpu 1\n";

struct Layer {
  int in = 0;
  int out = 0;
  size_t w_at = 0;  // offset of W (out, in) column-major in the flat parameters
  size_t b_at = 0;  // offset of b (out)
  bool relu = true;
};

class CpuDenseBackend final : public trainer::DenseBackend {
 public:
  explicit CpuDenseBackend(const DlrmConfig& config) : config_(config) {
    const int d = config.emb_dim;
    const int f1 = config.num_sparse + 1;
    num_pairs_ = f1 * (f1 - 1) / 2;
    // Every weight matrix and bias starts on a 64-byte boundary, so Eigen's vectorised
    // loops split the same way every run and results are bit-reproducible.
    size_t at = 0;
    auto pad = [](size_t n) { return (n + 15) / 16 * 16; };
    auto add = [&](std::vector<Layer>& layers, int in, int out, bool relu) {
      Layer l{in, out, at, at + pad(static_cast<size_t>(in) * out), relu};
      at = l.b_at + pad(out);
      layers.push_back(l);
    };
    int in = config.num_dense;
    for (int w : config.bottom_mlp) {
      add(bottom_, in, w, true);
      in = w;
    }
    add(bottom_, in, d, true);
    in = d + num_pairs_;
    for (int w : config.top_mlp) {
      add(top_, in, w, true);
      in = w;
    }
    add(top_, in, 1, false);
    params_.assign(at, 0.0f);
    grads_.assign(at, 0.0f);
    m_.assign(at, 0.0f);
    v_.assign(at, 0.0f);

    // Normal(0, sqrt(2 / (in + out))) weights and Normal(0, sqrt(1 / out)) biases, as DLRM.
    std::mt19937_64 rng(config.seed);
    for (const std::vector<Layer>* layers : {&bottom_, &top_}) {
      for (const Layer& l : *layers) {
        std::normal_distribution<float> w(0.0f, std::sqrt(2.0f / (l.in + l.out)));
        std::normal_distribution<float> b(0.0f, std::sqrt(1.0f / l.out));
        for (size_t i = 0; i < static_cast<size_t>(l.in) * l.out; ++i) params_[l.w_at + i] = w(rng);
        for (int i = 0; i < l.out; ++i) params_[l.b_at + i] = b(rng);
      }
    }
  }

  std::string name() const override { return "cpu-eigen"; }
  const DlrmConfig& config() const override { return config_; }
  absl::Span<float> Parameters() override { return absl::MakeSpan(params_); }
  absl::Span<const float> Gradients() const override { return absl::MakeConstSpan(grads_); }
  absl::Span<float> MutableGradients() override { return absl::MakeSpan(grads_); }

  absl::Status Forward(int batch, const float* dense, const float* embeddings,
                       float* logits) override {
    if (batch <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("batch must be > 0, got ", batch));
    }
    batch_ = batch;
    const int d = config_.emb_dim;
    const int f1 = config_.num_sparse + 1;
    embeddings_ = embeddings;

    input_ = ConstMatMap(dense, config_.num_dense, batch);
    RunLayers(bottom_, input_, bottom_h_);
    const Mat& z0 = bottom_h_.back();  // (d, batch)

    // T_b = [z0_b; e_1b; ...; e_Fb] (f1, d) per sample, stacked: (batch * f1, d).
    stacked_.resize(static_cast<Eigen::Index>(batch) * f1, d);
    for (int b = 0; b < batch; ++b) {
      stacked_.row(static_cast<Eigen::Index>(b) * f1) = z0.col(b).transpose();
      for (int f = 0; f < config_.num_sparse; ++f) {
        stacked_.row(static_cast<Eigen::Index>(b) * f1 + f + 1) =
            Eigen::Map<const Eigen::RowVectorXf>(
                embeddings + (static_cast<size_t>(f) * batch + b) * d, d);
      }
    }
    top_in_.resize(d + num_pairs_, batch);
    top_in_.topRows(d) = z0;
    RowMat gram(f1, f1);
    for (int b = 0; b < batch; ++b) {
      auto t = stacked_.middleRows(static_cast<Eigen::Index>(b) * f1, f1);
      gram.noalias() = t * t.transpose();
      int p = d;
      for (int i = 1; i < f1; ++i) {
        for (int j = 0; j < i; ++j) top_in_(p++, b) = gram(i, j);
      }
    }
    RunLayers(top_, top_in_, top_h_);
    const Mat& out = top_h_.back();
    for (int b = 0; b < batch; ++b) logits[b] = out(0, b);
    forward_done_ = true;
    return absl::OkStatus();
  }

  absl::StatusOr<double> Backward(const float* labels, float* embedding_grads) override {
    if (!forward_done_) {
      return absl::FailedPreconditionError("Backward called without a Forward");
    }
    forward_done_ = false;
    const int batch = batch_;
    const int d = config_.emb_dim;
    const int f1 = config_.num_sparse + 1;
    std::fill(grads_.begin(), grads_.end(), 0.0f);

    const Mat& logit = top_h_.back();
    if (back_[0].size() < static_cast<size_t>(batch)) back_[0].resize(batch);
    MatMap delta(back_[0].data(), 1, batch);
    double loss = 0.0;
    for (int b = 0; b < batch; ++b) {
      const float x = logit(0, b);
      const float y = labels[b];
      // Stable BCE with logits: max(x, 0) - x y + log(1 + exp(-|x|)).
      loss += std::max(x, 0.0f) - x * y + std::log1p(std::exp(-std::fabs(x)));
      const float p = 1.0f / (1.0f + std::exp(-x));
      delta(0, b) = (p - y) / static_cast<float>(batch);
    }
    loss /= batch;

    const MatMap d_top_in = BackLayers(top_, top_in_, top_h_, delta, /*need_input_grad=*/true);

    // Interaction backward: dT_b = (G + G^T) T_b with G(i, j) = dL/d<t_i, t_j>, i > j.
    d_z0_ = d_top_in.topRows(d);  // same size every step: the storage is kept
    Mat& d_z0 = d_z0_;
    RowMat g(f1, f1);
    RowMat dt(f1, d);
    for (int b = 0; b < batch; ++b) {
      g.setZero();
      int p = d;
      for (int i = 1; i < f1; ++i) {
        for (int j = 0; j < i; ++j) {
          const float v = d_top_in(p++, b);
          g(i, j) = v;
          g(j, i) = v;
        }
      }
      auto t = stacked_.middleRows(static_cast<Eigen::Index>(b) * f1, f1);
      dt.noalias() = g * t;
      d_z0.col(b) += dt.row(0).transpose();
      for (int f = 0; f < config_.num_sparse; ++f) {
        Eigen::Map<Eigen::RowVectorXf>(embedding_grads + (static_cast<size_t>(f) * batch + b) * d,
                                       d) = dt.row(f + 1);
      }
    }
    BackLayers(bottom_, input_, bottom_h_, MatMap(d_z0.data(), d, batch),
               /*need_input_grad=*/false);
    return loss;
  }

  // Magic, parameter count (u64), Adam step (i64), params, m, v (f32 each), CRC-32C (u32).
  std::string SaveState() const override {
    std::string out(kStateMagic);
    const uint64_t n = params_.size();
    out.append(reinterpret_cast<const char*>(&n), 8);
    out.append(reinterpret_cast<const char*>(&adam_t_), 8);
    for (const AlignedFloats* a : {&params_, &m_, &v_}) {
      out.append(reinterpret_cast<const char*>(a->data()), a->size() * sizeof(float));
    }
    const uint32_t crc = storage::Crc32c(out.data(), out.size());
    out.append(reinterpret_cast<const char*>(&crc), 4);
    return out;
  }

  absl::Status LoadState(absl::string_view state) override {
    const size_t header = kStateMagic.size() + 16;
    if (state.size() < header + 4 || state.substr(0, kStateMagic.size()) != kStateMagic) {
      return absl::DataLossError("dense state: not a CPU backend state (bad header)");
    }
    uint32_t crc = 0;
    std::memcpy(&crc, state.data() + state.size() - 4, 4);
    if (crc != storage::Crc32c(state.data(), state.size() - 4)) {
      return absl::DataLossError("dense state: checksum mismatch (truncated or corrupt)");
    }
    uint64_t n = 0;
    int64_t t = 0;
    std::memcpy(&n, state.data() + kStateMagic.size(), 8);
    std::memcpy(&t, state.data() + kStateMagic.size() + 8, 8);
    if (n != params_.size() || state.size() != header + 3 * n * sizeof(float) + 4) {
      return absl::InvalidArgumentError(absl::StrCat("dense state has ", n,
                                                     " parameters, this model has ", params_.size(),
                                                     "; same flags as the saved run?"));
    }
    const char* p = state.data() + header;
    for (AlignedFloats* a : {&params_, &m_, &v_}) {
      std::memcpy(a->data(), p, n * sizeof(float));
      p += n * sizeof(float);
    }
    adam_t_ = t;
    forward_done_ = false;
    return absl::OkStatus();
  }

  void ApplyGradients() override {
    const float lr = config_.learning_rate;
    if (config_.optimizer == DenseOptimizerType::kSgd) {
      for (size_t i = 0; i < params_.size(); ++i) params_[i] -= lr * grads_[i];
      return;
    }
    ++adam_t_;
    const float b1 = config_.beta1, b2 = config_.beta2, eps = config_.epsilon;
    const float c1 = 1.0f - static_cast<float>(std::pow(b1, adam_t_));
    const float c2 = 1.0f - static_cast<float>(std::pow(b2, adam_t_));
    for (size_t i = 0; i < params_.size(); ++i) {
      const float g = grads_[i];
      m_[i] = b1 * m_[i] + (1.0f - b1) * g;
      v_[i] = b2 * v_[i] + (1.0f - b2) * g * g;
      params_[i] -= lr * (m_[i] / c1) / (std::sqrt(v_[i] / c2) + eps);
    }
  }

 private:
  // h[l] = act(W_l h[l-1] + b_l); h[-1] = input.
  void RunLayers(const std::vector<Layer>& layers, const Mat& input, std::vector<Mat>& h) {
    h.resize(layers.size());
    const Mat* prev = &input;
    for (size_t l = 0; l < layers.size(); ++l) {
      const Layer& L = layers[l];
      ConstMatMap w(params_.data() + L.w_at, L.out, L.in);
      Eigen::Map<const Eigen::VectorXf> bias(params_.data() + L.b_at, L.out);
      h[l].resize(L.out, prev->cols());
      h[l].noalias() = w * (*prev);
      h[l].colwise() += bias;
      if (L.relu) h[l] = h[l].cwiseMax(0.0f);
      prev = &h[l];
    }
  }

  // Backward through `layers` given dL/d(output of last layer) in `delta` (overwritten:
  // it is scratch); returns dL/d input when asked, as a view into back_ that stays valid
  // until the next call. The per-layer gradients live in two buffers kept across steps,
  // so a step allocates (and page-faults) nothing.
  MatMap BackLayers(const std::vector<Layer>& layers, const Mat& input, const std::vector<Mat>& h,
                    MatMap delta, bool need_input_grad) {
    const Eigen::Index batch = delta.cols();
    int next_buffer = delta.data() == back_[0].data() ? 1 : 0;
    for (int l = static_cast<int>(layers.size()) - 1; l >= 0; --l) {
      const Layer& L = layers[l];
      if (L.relu) delta.array() *= (h[l].array() > 0.0f).cast<float>();
      const Mat& prev = l == 0 ? input : h[l - 1];
      MatMap gw(grads_.data() + L.w_at, L.out, L.in);
      VecMap gb(grads_.data() + L.b_at, L.out);
      gw.noalias() += delta * prev.transpose();
      gb += delta.rowwise().sum();
      if (l > 0 || need_input_grad) {
        ConstMatMap w(params_.data() + L.w_at, L.out, L.in);
        AlignedFloats& buffer = back_[next_buffer];
        if (buffer.size() < static_cast<size_t>(L.in) * batch) buffer.resize(L.in * batch);
        MatMap next(buffer.data(), L.in, batch);
        next.noalias() = w.transpose() * delta;
        new (&delta) MatMap(next.data(), L.in, batch);
        next_buffer ^= 1;
      }
    }
    return need_input_grad ? delta : MatMap(nullptr, 0, 0);
  }

  DlrmConfig config_;
  int num_pairs_ = 0;
  std::vector<Layer> bottom_, top_;
  using AlignedFloats = std::vector<float, Eigen::aligned_allocator<float>>;
  AlignedFloats params_, grads_, m_, v_;
  AlignedFloats back_[2];  // BackLayers' layer gradients, ping-pong
  Mat d_z0_;
  int64_t adam_t_ = 0;

  int batch_ = 0;
  bool forward_done_ = false;
  const float* embeddings_ = nullptr;
  Mat input_;
  std::vector<Mat> bottom_h_, top_h_;
  RowMat stacked_;
  Mat top_in_;
};

}  // namespace
}  // namespace tessera::trainer_internal

namespace tessera::trainer {

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

absl::StatusOr<std::unique_ptr<DenseBackend>> NewCpuDenseBackend(const DlrmConfig& config) {
  if (absl::Status s = ValidateDlrmConfig(config); !s.ok()) return s;
  return std::unique_ptr<DenseBackend>(new trainer_internal::CpuDenseBackend(config));
}

}  // namespace tessera::trainer
