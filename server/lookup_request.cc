#include "server/lookup_request.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "embedding/batch_ops.h"
#include "wire/packed_bytes.h"

namespace tessera::server {

namespace {

// ResourceExhausted when an answer of `rows` rows (ids, or bags) is over the limit.
absl::Status CheckAnswerRows(const std::string& what, int64_t rows, const AnswerLimit& limit) {
  if (rows <= limit.max_rows) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      what, ": an answer of ", rows, " rows (ids, or bags) is over the limit of ", limit.max_rows,
      " (", limit.flag, "): send smaller batches, or raise the limit"));
}

}  // namespace

absl::Status CheckPushBeforeLookup(const v1::BatchLookupRequest& request) {
  const v1::BatchPushRequest& push = request.push();
  if (push.shard_map_version() != request.shard_map_version()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a push carried by a lookup must be built on the lookup's shard map: version ",
                     push.shard_map_version(), " against ", request.shard_map_version()));
  }
  if (push.check_only()) {
    return absl::InvalidArgumentError(
        "a push carried by a lookup cannot be check_only: send the check round as a BatchPush");
  }
  if (push.has_sync() && push.sync().workers() > 1) {
    return absl::InvalidArgumentError(
        "a sync group's push cannot be carried by a lookup: send it as a BatchPush");
  }
  return absl::OkStatus();
}

absl::Status CheckRequest(const std::string& what, int64_t ids, const AnswerLimit& limit,
                          uint64_t version, const std::string& server, uint64_t serving) {
  if (ids > limit.max_rows) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": batch of ", ids, " ids is over ", server, "'s limit of ", limit.max_rows, " (",
        limit.flag, "): send smaller batches, or raise the limit"));
  }
  // A request built on another map is refused, not served (or routed) on this one.
  if (version != 0 && version != serving) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": request built on shard map version ",
                                                      version, ", ", server, " serves version ",
                                                      serving, "; refresh the shard map"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LookupView> PrepareLookup(const v1::LookupRequest& request, int dim,
                                         const AnswerLimit& limit, v1::LookupResponse* response) {
  LookupView v;
  v.ids = absl::Span<const int64_t>(request.ids().data(), request.ids_size());
  v.offsets = absl::Span<const int32_t>(request.offsets().data(), request.offsets_size());
  v.weights = absl::Span<const float>(request.weights().data(), request.weights_size());
  v.pooled = !v.offsets.empty();
  TESSERA_ASSIGN_OR_RETURN(
      const size_t rows, embedding::CheckLookupShape(absl::StrCat("table '", request.table(), "'"),
                                                     v.ids.size(), v.offsets, v.weights));
  TESSERA_RETURN_IF_ERROR(CheckAnswerRows(absl::StrCat("table '", request.table(), "'"),
                                          static_cast<int64_t>(rows), limit));
  response->set_dim(dim);
  // Every value is written by the lookup, so the buffer is not zero-filled first.
  auto* values = response->mutable_values();
  values->Clear();
  const int64_t wide = static_cast<int64_t>(rows) * dim;
  if (wide > std::numeric_limits<int>::max()) {
    return absl::ResourceExhaustedError(absl::StrCat("table '", request.table(), "': an answer of ",
                                                     wide, " floats is too large for one message"));
  }
  const int floats = static_cast<int>(wide);
  values->Reserve(floats);
  v.out = absl::MakeSpan(values->AddNAlreadyReserved(floats), static_cast<size_t>(floats));
  return v;
}

namespace {

std::string TablePart(const std::string& table, size_t index) {
  return absl::StrCat("table '", table, "' (part ", index, " of the batch)");
}

}  // namespace

absl::Status PrepareBatchLookup(const v1::BatchLookupRequest& request, const ConfigLookup& config,
                                const AnswerLimit& limit, v1::BatchLookupResponse* response,
                                DecodedBatch* batch, bool size_answers) {
  const size_t n = request.tables_size();
  embedding::ResizeConfigSlots(n, &batch->configs, &batch->config_refs);
  batch->counters.assign(n, nullptr);
  batch->lookups.assign(n, {});
  batch->total_ids = 0;
  batch->id_copies.resize(n);
  batch->offset_copies.resize(n);
  batch->float_copies.resize(n);
  response->clear_tables();
  std::vector<size_t> answer_rows;
  int64_t total_rows = 0;
  for (size_t i = 0; i < n; ++i) {
    const v1::TableLookup& t = request.tables(i);
    TESSERA_ASSIGN_OR_RETURN(ConfigRef c, config(t.table(), &batch->counters[i]));
    embedding::SetConfigSlot(i, std::move(c), &batch->configs, &batch->config_refs);
    const std::string where = TablePart(t.table(), i);
    embedding::TableBags& part = batch->lookups[i];
    part.table = t.table();
    part.pooling = t.pooling();
    TESSERA_ASSIGN_OR_RETURN(
        part.ids, wire::PackedSpan<int64_t>(t.ids(), where + " ids", &batch->id_copies[i]));
    TESSERA_ASSIGN_OR_RETURN(
        part.offsets,
        wire::PackedSpan<int32_t>(t.offsets(), where + " offsets", &batch->offset_copies[i]));
    TESSERA_ASSIGN_OR_RETURN(part.weights, wire::PackedSpan<float>(t.weights(), where + " weights",
                                                                   &batch->float_copies[i]));
    TESSERA_ASSIGN_OR_RETURN(
        const size_t rows,
        embedding::CheckLookupShape(where, part.ids.size(), part.offsets, part.weights));
    batch->total_ids += static_cast<int64_t>(part.ids.size());
    answer_rows.push_back(rows);
    total_rows += static_cast<int64_t>(rows);
  }
  // The whole answer is bounded before any of it is allocated.
  TESSERA_RETURN_IF_ERROR(CheckAnswerRows("batched lookup", total_rows, limit));
  for (size_t i = 0; i < n; ++i) {
    const size_t rows = answer_rows[i];
    const int dim = batch->configs[i].dim();
    v1::TableValues* values = response->add_tables();
    values->set_dim(dim);
    values->set_rows(static_cast<int32_t>(rows));
    if (!size_answers) continue;  // forwarded: the shards' answers go in as they are
    batch->lookups[i].out =
        absl::MakeSpan(wire::ResizePacked<float>(values->mutable_values(), rows * dim), rows * dim);
  }
  return absl::OkStatus();
}

absl::Status PrepareBatchPush(const v1::BatchPushRequest& request, const ConfigLookup& config,
                              DecodedBatch* batch) {
  const size_t n = request.tables_size();
  embedding::ResizeConfigSlots(n, &batch->configs, &batch->config_refs);
  batch->counters.assign(n, nullptr);
  batch->pushes.assign(n, {});
  batch->total_ids = 0;
  batch->id_copies.resize(n);
  batch->float_copies.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const v1::TableGradients& t = request.tables(i);
    TESSERA_ASSIGN_OR_RETURN(ConfigRef c, config(t.table(), &batch->counters[i]));
    embedding::SetConfigSlot(i, std::move(c), &batch->configs, &batch->config_refs);
    const std::string where = TablePart(t.table(), i);
    embedding::TableGradients& part = batch->pushes[i];
    part.table = t.table();
    TESSERA_ASSIGN_OR_RETURN(
        part.ids, wire::PackedSpan<int64_t>(t.ids(), where + " ids", &batch->id_copies[i]));
    TESSERA_ASSIGN_OR_RETURN(
        part.gradients,
        wire::PackedSpan<float>(t.gradients(), where + " gradients", &batch->float_copies[i]));
    batch->total_ids += static_cast<int64_t>(part.ids.size());
  }
  batch->checked = {};
  TESSERA_ASSIGN_OR_RETURN(batch->checked, embedding::CheckPush(batch->configs, batch->pushes));
  return absl::OkStatus();
}

}  // namespace tessera::server
