#include "embedding/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "embedding/internal/row_ops.h"
#include "embedding/row_math.h"

namespace tessera::embedding {
namespace {

using embedding_internal::AllFinite;
using embedding_internal::FiniteBits;
using embedding_internal::kFiniteBitsAll;

// A row's step computed into locals (registers, for these dims), checked, then stored:
// no copy of the row to put back, no second pass over it. `element(i, w, s...)` is
// row_math's update of element i on copies of its weight and state values.
template <int D, int S, typename Element>
bool StepInRegisters(float* __restrict w, float* __restrict state, const Element& element) {
  float nw[D];
  float ns[S * D];
  uint32_t least = kFiniteBitsAll;
  for (int i = 0; i < D; ++i) {
    nw[i] = w[i];
    for (int k = 0; k < S; ++k) ns[k * D + i] = state[k * D + i];
    if constexpr (S == 1) {
      element(i, nw[i], ns[i]);
    } else {
      element(i, nw[i], ns[i], ns[D + i]);
    }
    least = std::min(least, FiniteBits(nw[i]));
    for (int k = 0; k < S; ++k) least = std::min(least, FiniteBits(ns[k * D + i]));
  }
  if (least == 0) return false;
  std::memcpy(w, nw, sizeof(nw));
  std::memcpy(state, ns, sizeof(ns));
  return true;
}

// StepInRegisters<dim> for the dims it is made for; nullopt for others.
template <int S, typename Element>
std::optional<bool> StepByDim(int dim, float* w, float* state, const Element& element) {
  switch (dim) {
    case 8:
      return StepInRegisters<8, S>(w, state, element);
    case 16:
      return StepInRegisters<16, S>(w, state, element);
    case 32:
      return StepInRegisters<32, S>(w, state, element);
    case 64:
      return StepInRegisters<64, S>(w, state, element);
    case 128:
      return StepInRegisters<128, S>(w, state, element);
    default:
      return std::nullopt;
  }
}

// Each step is a loop over the row's elements of row_math's update, the definition the
// device table runs too.
class Sgd final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  int StateFloats() const override { return 0; }
  void InitState(float*) const override {}

 protected:
  void Step(float* __restrict w, float*, const float* __restrict g, int64_t) const override {
    const float lr = params_.learning_rate;
    for (int i = 0; i < dim_; ++i) row_math::SgdElement(w[i], g[i], lr);
  }
};

// state: accumulator (dim).
class Adagrad final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  int StateFloats() const override { return dim_; }
  void InitState(float* s) const override { std::fill(s, s + dim_, params_.initial_accumulator); }

 protected:
  void Step(float* __restrict w, float* __restrict acc, const float* __restrict g,
            int64_t) const override {
    const float lr = params_.learning_rate;
    const float eps = params_.epsilon;
    for (int i = 0; i < dim_; ++i) row_math::AdagradElement(w[i], acc[i], g[i], lr, eps);
  }
  bool StepFinite(float* w, float* acc, const float* g, int64_t prior) const override {
    const float lr = params_.learning_rate;
    const float eps = params_.epsilon;
    const std::optional<bool> kept = StepByDim<1>(dim_, w, acc, [&](int i, float& wi, float& ai) {
      row_math::AdagradElement(wi, ai, g[i], lr, eps);
    });
    return kept.has_value() ? *kept : Optimizer::StepFinite(w, acc, g, prior);
  }
};

// state: one accumulator of mean squared gradients for the row.
class RowWiseAdagrad final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  int StateFloats() const override { return 1; }
  void InitState(float* s) const override { s[0] = params_.initial_accumulator; }

 protected:
  void Step(float* __restrict w, float* __restrict acc, const float* __restrict g,
            int64_t) const override {
    float sq = 0.0f;
    for (int i = 0; i < dim_; ++i) sq += g[i] * g[i];
    const float scale =
        row_math::RowWiseAdagradScale(acc[0], sq, dim_, params_.learning_rate, params_.epsilon);
    for (int i = 0; i < dim_; ++i) row_math::RowWiseAdagradElement(w[i], g[i], scale);
  }
};

// state: m (dim), v (dim); the step count t is the row's update count.
class Adam final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  int StateFloats() const override { return 2 * dim_; }
  void InitState(float* s) const override { std::fill(s, s + 2 * dim_, 0.0f); }

 protected:
  void Step(float* __restrict w, float* __restrict s, const float* __restrict g,
            int64_t prior_updates) const override {
    const row_math::AdamCorrection c =
        row_math::AdamCorrectionOf(params_.beta1, params_.beta2, prior_updates);
    float* m = s;
    float* v = s + dim_;
    for (int i = 0; i < dim_; ++i) row_math::AdamElement(w[i], m[i], v[i], g[i], hyper_, c);
  }
  bool StepFinite(float* w, float* s, const float* g, int64_t prior_updates) const override {
    const row_math::AdamCorrection c =
        row_math::AdamCorrectionOf(params_.beta1, params_.beta2, prior_updates);
    const std::optional<bool> kept =
        StepByDim<2>(dim_, w, s, [&](int i, float& wi, float& mi, float& vi) {
          row_math::AdamElement(wi, mi, vi, g[i], hyper_, c);
        });
    return kept.has_value() ? *kept : Optimizer::StepFinite(w, s, g, prior_updates);
  }
};

// FTRL-Proximal: row_math::FtrlElement. state: z (dim), n (dim).
class Ftrl final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  int StateFloats() const override { return 2 * dim_; }
  void InitState(float* s) const override {
    std::fill(s, s + dim_, 0.0f);
    std::fill(s + dim_, s + 2 * dim_, params_.initial_accumulator);
  }

 protected:
  void Step(float* __restrict w, float* __restrict s, const float* __restrict g,
            int64_t) const override {
    float* z = s;
    float* n = s + dim_;
    for (int i = 0; i < dim_; ++i) row_math::FtrlElement(w[i], z[i], n[i], g[i], hyper_);
  }
};

absl::Status CheckPositive(float v, absl::string_view name) {
  if (!(v > 0.0f) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer ", name, " must be > 0, got ", v));
  }
  return absl::OkStatus();
}

absl::Status CheckNonNegative(float v, absl::string_view name) {
  if (!(v >= 0.0f) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer ", name, " must be >= 0, got ", v));
  }
  return absl::OkStatus();
}

}  // namespace

row_math::Hyper HyperOf(const OptimizerParams& p) {
  row_math::Hyper h;
  h.lr = p.learning_rate;
  h.eps = p.epsilon;
  h.beta1 = p.beta1;
  h.beta2 = p.beta2;
  h.l1 = p.l1;
  h.l2 = p.l2;
  h.lr_power = p.learning_rate_power;
  h.clip_norm = p.clip_norm;
  h.clip_value = p.clip_value;
  h.weight_decay = p.weight_decay;
  return h;
}

row_math::OptimizerKind KindOf(v1::OptimizerType type) {
  switch (type) {
    case v1::SGD:
      return row_math::OptimizerKind::kSgd;
    case v1::ROWWISE_ADAGRAD:
      return row_math::OptimizerKind::kRowWiseAdagrad;
    case v1::ADAM:
      return row_math::OptimizerKind::kAdam;
    case v1::FTRL:
      return row_math::OptimizerKind::kFtrl;
    default:
      return row_math::OptimizerKind::kAdagrad;
  }
}

std::string OptimizerName(v1::OptimizerType type) {
  switch (type) {
    case v1::SGD:
      return "sgd";
    case v1::OPTIMIZER_UNSPECIFIED:
    case v1::ADAGRAD:
      return "adagrad";
    case v1::ROWWISE_ADAGRAD:
      return "rowwise_adagrad";
    case v1::ADAM:
      return "adam";
    case v1::FTRL:
      return "ftrl";
    default:
      return absl::StrCat("unknown(", static_cast<int>(type), ")");
  }
}

absl::StatusOr<v1::OptimizerType> ParseOptimizerName(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (v1::OptimizerType t : {v1::SGD, v1::ADAGRAD, v1::ROWWISE_ADAGRAD, v1::ADAM, v1::FTRL}) {
    if (lower == OptimizerName(t)) return t;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown optimizer '", name, "'; expected sgd, adagrad, rowwise_adagrad, adam or ftrl"));
}

absl::StatusOr<OptimizerParams> ResolveOptimizer(const v1::OptimizerConfig& c) {
  OptimizerParams p;
  p.type = c.type() == v1::OPTIMIZER_UNSPECIFIED ? v1::ADAGRAD : c.type();
  if (!v1::OptimizerType_IsValid(p.type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown optimizer type ", static_cast<int>(c.type())));
  }
  p.epsilon = p.type == v1::ADAM ? 1e-8f : 1e-10f;
  if (c.has_learning_rate()) p.learning_rate = c.learning_rate();
  if (c.has_epsilon()) p.epsilon = c.epsilon();
  if (c.has_beta1()) p.beta1 = c.beta1();
  if (c.has_beta2()) p.beta2 = c.beta2();
  if (c.has_initial_accumulator()) p.initial_accumulator = c.initial_accumulator();
  if (c.has_l1()) p.l1 = c.l1();
  if (c.has_l2()) p.l2 = c.l2();
  if (c.has_learning_rate_power()) p.learning_rate_power = c.learning_rate_power();
  if (c.has_clip_norm()) p.clip_norm = c.clip_norm();
  if (c.has_clip_value()) p.clip_value = c.clip_value();
  if (c.has_weight_decay()) p.weight_decay = c.weight_decay();

  if (auto s = CheckPositive(p.learning_rate, "learning_rate"); !s.ok()) return s;
  if (auto s = CheckNonNegative(p.epsilon, "epsilon"); !s.ok()) return s;
  if (auto s = CheckNonNegative(p.initial_accumulator, "initial_accumulator"); !s.ok()) return s;
  if (auto s = CheckNonNegative(p.l1, "l1"); !s.ok()) return s;
  if (auto s = CheckNonNegative(p.l2, "l2"); !s.ok()) return s;
  if (auto s = CheckNonNegative(p.clip_norm, "clip_norm"); !s.ok()) return s;
  if (auto s = CheckNonNegative(p.clip_value, "clip_value"); !s.ok()) return s;
  if (auto s = CheckNonNegative(p.weight_decay, "weight_decay"); !s.ok()) return s;
  if (!(p.beta1 >= 0.0f && p.beta1 < 1.0f) || !(p.beta2 >= 0.0f && p.beta2 < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer beta1 and beta2 must be in [0, 1), got ", p.beta1, " and ", p.beta2));
  }
  if (!(p.learning_rate_power <= 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer learning_rate_power must be <= 0, got ", p.learning_rate_power));
  }
  return p;
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const v1::OptimizerConfig& config,
                                                             int dim) {
  if (dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer dimension must be > 0, got ", dim));
  }
  absl::StatusOr<OptimizerParams> params = ResolveOptimizer(config);
  if (!params.ok()) return params.status();
  switch (params->type) {
    case v1::SGD:
      return std::unique_ptr<Optimizer>(new Sgd(*params, dim));
    case v1::ADAGRAD:
      return std::unique_ptr<Optimizer>(new Adagrad(*params, dim));
    case v1::ROWWISE_ADAGRAD:
      return std::unique_ptr<Optimizer>(new RowWiseAdagrad(*params, dim));
    case v1::ADAM:
      return std::unique_ptr<Optimizer>(new Adam(*params, dim));
    case v1::FTRL:
      return std::unique_ptr<Optimizer>(new Ftrl(*params, dim));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown optimizer type ", static_cast<int>(params->type)));
  }
}

void Optimizer::Update(float* w, float* state, float* g, int64_t prior_updates) const {
  row_math::PreprocessRow(hyper_, dim_, w, g);  // clipping and weight decay, as on a device
  Step(w, state, g, prior_updates);
}

bool Optimizer::StepFinite(float* w, float* state, const float* grad, int64_t prior_updates) const {
  const int sf = StateFloats();
  thread_local std::vector<float> saved;
  saved.resize(static_cast<size_t>(dim_ + sf));
  std::copy(w, w + dim_, saved.begin());
  std::copy(state, state + sf, saved.begin() + dim_);
  Step(w, state, grad, prior_updates);
  if (AllFinite(w, dim_) && AllFinite(state, sf)) return true;
  std::copy(saved.begin(), saved.begin() + dim_, w);
  std::copy(saved.begin() + dim_, saved.end(), state);
  return false;
}

bool Optimizer::UpdateFinite(float* w, float* state, const float* grad, float* scratch,
                             int64_t prior_updates) const {
  if (params_.clip_value > 0.0f || params_.clip_norm > 0.0f || params_.weight_decay > 0.0f) {
    std::copy(grad, grad + dim_, scratch);
    row_math::PreprocessRow(hyper_, dim_, w, scratch);
    grad = scratch;
  }
  return StepFinite(w, state, grad, prior_updates);
}

}  // namespace tessera::embedding
