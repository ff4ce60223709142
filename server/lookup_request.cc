#include "server/lookup_request.h"

#include "absl/strings/str_cat.h"
#include "embedding/batch_ops.h"
#include "embedding/status.h"

namespace tessera::server {

absl::StatusOr<LookupView> PrepareLookup(const v1::LookupRequest& request, int dim,
                                         v1::LookupResponse* response) {
  LookupView v;
  v.ids = absl::Span<const int64_t>(request.ids().data(), request.ids_size());
  v.offsets = absl::Span<const int32_t>(request.offsets().data(), request.offsets_size());
  v.weights = absl::Span<const float>(request.weights().data(), request.weights_size());
  v.pooled = !v.offsets.empty();
  int rows = request.ids_size();
  if (v.pooled) {
    TESSERA_RETURN_IF_ERROR(
        Annotate(embedding::ValidateBags(v.ids.size(), v.offsets, v.weights.size()),
                 absl::StrCat("table '", request.table(), "'")));
    rows = request.offsets_size() - 1;
  } else if (!v.weights.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", request.table(), "': weights need bag offsets"));
  }
  response->set_dim(dim);
  // Every value is written by the lookup, so the buffer is not zero-filled first.
  auto* values = response->mutable_values();
  values->Clear();
  values->Reserve(rows * dim);
  v.out = absl::MakeSpan(values->AddNAlreadyReserved(rows * dim), static_cast<size_t>(rows) * dim);
  return v;
}

}  // namespace tessera::server
