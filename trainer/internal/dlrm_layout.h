#ifndef TESSERA_TRAINER_INTERNAL_DLRM_LAYOUT_H_
#define TESSERA_TRAINER_INTERNAL_DLRM_LAYOUT_H_

// What every DenseBackend shares, so that their parameters, initial weights and saved
// state are interchangeable: where each layer's weights and bias sit in the flat parameter
// array, how they are initialised, and the byte format of SaveState.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "trainer/dense_backend.h"

namespace tessera::trainer_internal {

struct DenseLayer {
  int in = 0;
  int out = 0;
  size_t w_at = 0;  // offset of W (out, in), column-major, in the flat parameters
  size_t b_at = 0;  // offset of b (out)
  bool relu = true;
};

// The bottom MLP (num_dense -> ... -> emb_dim, ReLU throughout), the interaction (the
// bottom output and the num_sparse pooled embeddings, f1 = num_sparse + 1 vectors, give
// num_pairs = f1 (f1 - 1) / 2 dot products), and the top MLP (emb_dim + num_pairs -> ...
// -> 1, no ReLU on the logit). Every weight matrix and bias starts on a 64-byte boundary.
struct DlrmLayout {
  explicit DlrmLayout(const trainer::DlrmConfig& config);

  std::vector<DenseLayer> bottom, top;
  int f1 = 0;         // vectors in the interaction
  int num_pairs = 0;  // their pairwise dot products, (i, j) with j < i, by i then j
  int top_in = 0;     // emb_dim + num_pairs
  size_t num_params = 0;
};

// Normal(0, sqrt(2 / (in + out))) weights and Normal(0, sqrt(1 / out)) biases, as DLRM,
// drawn from config.seed layer by layer; padding stays 0.
std::vector<float> InitialDlrmParameters(const trainer::DlrmConfig& config,
                                         const DlrmLayout& layout);

// SaveState's bytes: magic, parameter count (u64), Adam step (i64), params, m, v (f32
// each), CRC-32C (u32). Every backend writes and reads this format.
std::string EncodeDenseState(absl::Span<const float> params, absl::Span<const float> m,
                             absl::Span<const float> v, int64_t adam_step);

// Reads `state` into params, m and v (each num_params long) and *adam_step. DataLoss for
// bytes that are not a dense state or fail the checksum, InvalidArgument for another
// parameter count; nothing is written then.
absl::Status DecodeDenseState(absl::string_view state, absl::Span<float> params,
                              absl::Span<float> m, absl::Span<float> v, int64_t* adam_step);

// The activations of a Forward, which one Backward consumes: a Backward with no Forward
// of its own before it is refused (FailedPrecondition).
class ForwardGate {
 public:
  void Open() { open_ = true; }
  void Close() { open_ = false; }
  absl::Status Take() {
    if (!open_) return absl::FailedPreconditionError("Backward called without a Forward");
    open_ = false;
    return absl::OkStatus();
  }

 private:
  bool open_ = false;
};

}  // namespace tessera::trainer_internal

#endif  // TESSERA_TRAINER_INTERNAL_DLRM_LAYOUT_H_
