#ifndef TESSERA_EMBEDDING_OPTIMIZER_H_
#define TESSERA_EMBEDDING_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "embedding/row_math.h"
#include "tessera/v1/config.pb.h"

namespace tessera::embedding {

// Hyper-parameters of a row-wise optimizer with every default filled in.
struct OptimizerParams {
  v1::OptimizerType type = v1::ADAGRAD;
  float learning_rate = 0.01f;
  float epsilon = 1e-10f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float initial_accumulator = 0.0f;
  float l1 = 0.0f;
  float l2 = 0.0f;
  float learning_rate_power = -0.5f;
  float clip_norm = 0.0f;     // 0 = off
  float clip_value = 0.0f;    // 0 = off
  float weight_decay = 0.0f;  // 0 = off
};

// Resolves the defaults of `config` and checks the ranges; InvalidArgument names the
// bad field.
absl::StatusOr<OptimizerParams> ResolveOptimizer(const v1::OptimizerConfig& config);

// The hyper-parameters row_math's per-element updates take (the device table's too).
row_math::Hyper HyperOf(const OptimizerParams& params);

// row_math's name for an optimizer type (ADAGRAD for OPTIMIZER_UNSPECIFIED).
row_math::OptimizerKind KindOf(v1::OptimizerType type);

// The name a person reads ("adagrad", "rowwise_adagrad", ...).
std::string OptimizerName(v1::OptimizerType type);

// Parses a name as written by OptimizerName; InvalidArgument for anything else.
absl::StatusOr<v1::OptimizerType> ParseOptimizerName(absl::string_view name);

// A row-wise sparse optimizer: updates one row's weights and optimizer state from the
// gradient of that row summed over the batch. Stateless itself (all state lives in
// the row), so one instance is shared by every thread; calls on distinct rows may run
// concurrently.
//
// Before the update proper, the summed gradient g is preprocessed in this order:
// element-wise clip to [-clip_value, clip_value], scale so that ||g||_2 <= clip_norm,
// then g += weight_decay * w (coupled L2 decay).
class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // Creates the optimizer for rows of `dim` floats.
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(const v1::OptimizerConfig& config,
                                                           int dim);

  // Floats of optimizer state per row, stored right after the weights.
  virtual int StateFloats() const = 0;

  // Writes the initial state of a new row: (StateFloats()).
  virtual void InitState(float* state) const = 0;

  // Applies one step. `w` (dim) and `state` (StateFloats()) belong to one row; `grad`
  // (dim) is the summed gradient and is used as scratch (overwritten).
  // `prior_updates` is how many updates this row has had before (Adam's t - 1).
  void Update(float* w, float* state, float* grad, int64_t prior_updates) const;

  // Update for a gradient the caller keeps, kept only when every new weight and state
  // value is finite: otherwise `w` and `state` keep their values and it returns false (a
  // row whose update would overflow keeps its last finite values rather than serving Inf
  // or NaN). `grad` (dim) is only read, copied into `scratch` (dim) first when clipping or
  // weight decay change it.
  bool UpdateFinite(float* w, float* state, const float* grad, float* scratch,
                    int64_t prior_updates) const;

  const OptimizerParams& params() const { return params_; }
  int dim() const { return dim_; }

 protected:
  Optimizer(const OptimizerParams& params, int dim)
      : params_(params), hyper_(HyperOf(params)), dim_(dim) {}

  // The update proper on a preprocessed gradient.
  virtual void Step(float* w, float* state, const float* grad, int64_t prior_updates) const = 0;
  // Step, kept only when every value it writes is finite; true when kept. This one saves
  // the row, steps and puts it back; optimizers override it for common dims with the new
  // values computed in registers and stored once checked (the same math, bit for bit).
  virtual bool StepFinite(float* w, float* state, const float* grad, int64_t prior_updates) const;

  OptimizerParams params_;
  row_math::Hyper hyper_;  // the same values, for row_math's updates
  int dim_;
};

}  // namespace tessera::embedding

#endif  // TESSERA_EMBEDDING_OPTIMIZER_H_
