#ifndef TESSERA_WIRE_ROW_CHUNK_H_
#define TESSERA_WIRE_ROW_CHUNK_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "embedding/collection.h"
#include "tessera/v1/embedding_service.pb.h"
#include "wire/packed_bytes.h"

namespace tessera::wire {

// embedding::RowBlock <-> its wire form (packed little-endian arrays).
inline void ToChunk(const embedding::RowBlock& b, v1::RowChunk* out) {
  out->set_dim(b.dim);
  out->set_state_floats(b.state.empty() ? 0 : b.state_floats);
  SetPacked<int64_t>(b.ids, out->mutable_ids());
  SetPacked<float>(b.weights, out->mutable_weights());
  SetPacked<float>(b.state, out->mutable_state());
  SetPacked<int64_t>(b.last_steps, out->mutable_last_steps());
  SetPacked<int64_t>(b.update_counts, out->mutable_update_counts());
}

// InvalidArgument for arrays that are not whole values; shapes are checked by the table
// (embedding::CheckRowBlock).
inline absl::StatusOr<embedding::RowBlock> FromChunk(const v1::RowChunk& c) {
  embedding::RowBlock b;
  b.dim = c.dim();
  b.state_floats = c.state_floats();
  std::vector<int64_t> i64;
  std::vector<float> f32;
  TESSERA_ASSIGN_OR_RETURN(auto ids, PackedSpan<int64_t>(c.ids(), "rows: ids", &i64));
  b.ids.assign(ids.begin(), ids.end());
  TESSERA_ASSIGN_OR_RETURN(auto w, PackedSpan<float>(c.weights(), "rows: weights", &f32));
  b.weights.assign(w.begin(), w.end());
  TESSERA_ASSIGN_OR_RETURN(auto st, PackedSpan<float>(c.state(), "rows: state", &f32));
  b.state.assign(st.begin(), st.end());
  TESSERA_ASSIGN_OR_RETURN(auto ls, PackedSpan<int64_t>(c.last_steps(), "rows: last steps", &i64));
  b.last_steps.assign(ls.begin(), ls.end());
  TESSERA_ASSIGN_OR_RETURN(auto uc,
                           PackedSpan<int64_t>(c.update_counts(), "rows: update counts", &i64));
  b.update_counts.assign(uc.begin(), uc.end());
  return b;
}

}  // namespace tessera::wire

#endif  // TESSERA_WIRE_ROW_CHUNK_H_
