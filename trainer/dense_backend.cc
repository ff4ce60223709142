#include "trainer/dense_backend.h"

#include "absl/strings/str_cat.h"

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

absl::StatusOr<std::unique_ptr<DenseBackend>> NewDenseBackend(absl::string_view kind,
                                                              const DlrmConfig& config) {
  if (kind == "cpu") return NewCpuDenseBackend(config);
  if (kind == "cuda") return NewCudaDenseBackend(config);
  return absl::InvalidArgumentError(
      absl::StrCat("dense backend must be cpu or cuda, got '", kind, "'"));
}

}  // namespace tessera::trainer
