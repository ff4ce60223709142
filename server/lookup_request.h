#ifndef TESSERA_SERVER_LOOKUP_REQUEST_H_
#define TESSERA_SERVER_LOOKUP_REQUEST_H_

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "tessera/v1/embedding_service.pb.h"

namespace tessera::server {

// A LookupRequest whose shape has been checked, as spans over its fields, with the
// response values sized to receive the answer.
struct LookupView {
  absl::Span<const int64_t> ids;
  absl::Span<const int32_t> offsets;  // empty: one row per id
  absl::Span<const float> weights;
  bool pooled = false;
  absl::Span<float> out;  // the response's values: (ids or bags, dim)
};

// Checks weights and bag offsets of `request` for a table of `dim`, sets response->dim()
// and sizes its values. InvalidArgument names the table and the broken rule.
absl::StatusOr<LookupView> PrepareLookup(const v1::LookupRequest& request, int dim,
                                         v1::LookupResponse* response);

}  // namespace tessera::server

#endif  // TESSERA_SERVER_LOOKUP_REQUEST_H_
