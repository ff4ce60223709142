// The CPU DenseBackend: DLRM's dense network on Eigen, single-threaded per backend so a
// step is bit-reproducible.

#include <cmath>
#include <cstring>

#include "Eigen/Dense"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "trainer/dense_backend.h"
#include "trainer/internal/dlrm_layout.h"

namespace tessera::trainer_internal {
namespace {

using trainer::DenseOptimizerType;
using trainer::DlrmConfig;
using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic>;
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<Mat>;
using ConstMatMap = Eigen::Map<const Mat>;
using VecMap = Eigen::Map<Eigen::VectorXf>;
using Layer = DenseLayer;

class CpuDenseBackend final : public trainer::DenseBackend {
 public:
  explicit CpuDenseBackend(const DlrmConfig& config)
      : config_(config), layout_(config), bottom_(layout_.bottom), top_(layout_.top) {
    num_pairs_ = layout_.num_pairs;
    const std::vector<float> initial = InitialDlrmParameters(config, layout_);
    params_.assign(initial.begin(), initial.end());
    grads_.assign(layout_.num_params, 0.0f);
    m_.assign(layout_.num_params, 0.0f);
    v_.assign(layout_.num_params, 0.0f);
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
    forward_.Open();
    return absl::OkStatus();
  }

  absl::StatusOr<double> Backward(const float* labels, float* embedding_grads) override {
    TESSERA_RETURN_IF_ERROR(forward_.Take());
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

  std::string SaveState() const override { return EncodeDenseState(params_, m_, v_, adam_t_); }

  absl::Status LoadState(absl::string_view state) override {
    AlignedFloats p(params_.size()), m(params_.size()), v(params_.size());
    int64_t t = 0;
    if (absl::Status s = DecodeDenseState(state, absl::MakeSpan(p), absl::MakeSpan(m),
                                          absl::MakeSpan(v), &t);
        !s.ok()) {
      return s;
    }
    params_.swap(p);
    m_.swap(m);
    v_.swap(v);
    adam_t_ = t;
    forward_.Close();
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
  DlrmLayout layout_;
  const std::vector<Layer>& bottom_;
  const std::vector<Layer>& top_;
  int num_pairs_ = 0;
  using AlignedFloats = std::vector<float, Eigen::aligned_allocator<float>>;
  AlignedFloats params_, grads_, m_, v_;
  AlignedFloats back_[2];  // BackLayers' layer gradients, ping-pong
  Mat d_z0_;
  int64_t adam_t_ = 0;

  int batch_ = 0;
  ForwardGate forward_;  // open from a Forward to its Backward
  const float* embeddings_ = nullptr;
  Mat input_;
  std::vector<Mat> bottom_h_, top_h_;
  RowMat stacked_;
  Mat top_in_;
};

}  // namespace
}  // namespace tessera::trainer_internal

namespace tessera::trainer {

absl::StatusOr<std::unique_ptr<DenseBackend>> NewCpuDenseBackend(const DlrmConfig& config) {
  if (absl::Status s = ValidateDlrmConfig(config); !s.ok()) return s;
  return std::unique_ptr<DenseBackend>(new trainer_internal::CpuDenseBackend(config));
}

}  // namespace tessera::trainer
