#ifndef TESSERA_SERVER_LOOKUP_REQUEST_H_
#define TESSERA_SERVER_LOOKUP_REQUEST_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "embedding/batch_ops.h"
#include "embedding/collection.h"
#include "embedding/table_config.h"
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

// The most rows (ids, or bags: empty bags cost no ids but answer a row each) a server
// answers for one request, and the flag that sets it ("tessera-shard --max_batch_ids"),
// which the refusal names.
struct AnswerLimit {
  int64_t max_rows = 0;
  const char* flag = "";
};

// A server's checks of any request before its values: ResourceExhausted when its `ids` are
// over `limit` (naming the flag); FailedPrecondition when it was built on shard map
// `version` (0: any) while `server` ("shard 2", "the coordinator") serves `serving`.
absl::Status CheckRequest(const std::string& what, int64_t ids, const AnswerLimit& limit,
                          uint64_t version, const std::string& server, uint64_t serving);

// Checks weights and bag offsets of `request` for a table of `dim`, sets response->dim()
// and sizes its values. InvalidArgument names the table and the broken rule;
// ResourceExhausted, before anything is allocated, when the answer would hold more rows
// than `limit` allows.
absl::StatusOr<LookupView> PrepareLookup(const v1::LookupRequest& request, int dim,
                                         const AnswerLimit& limit, v1::LookupResponse* response);

// A table's request counts on a shard, bumped without a lock by the RPCs that serve it.
struct TableCounters {
  std::atomic<int64_t> lookups{0};  // ids looked up
  std::atomic<int64_t> updates{0};  // distinct ids updated
};

using embedding::ConfigRef;

// The config of a table a batched request names, looked up by the server that serves it,
// and that table's counters (left null by a server that keeps none).
using ConfigLookup = std::function<absl::StatusOr<ConfigRef>(
    const std::string& table, std::shared_ptr<TableCounters>* counters)>;

// A batched request decoded into spans over its packed fields, with each table's config.
// Holds copies of fields that were not aligned for their type (never, for a parsed
// message), so it must outlive the spans.
struct DecodedBatch {
  std::vector<v1::TableConfig> configs;                  // per table of the request
  // What configs[i] was copied from, when PrepareBatch* set it (embedding::SetConfigSlot): a
  // batch kept for the next request (a thread's own) copies only the configs not already in
  // place. Code that sets `configs` otherwise clears this (or copies it with them).
  std::vector<ConfigRef> config_refs;
  std::vector<std::shared_ptr<TableCounters>> counters;  // per table (null: none kept)
  std::vector<embedding::TableBags> lookups;             // BatchLookup
  std::vector<embedding::TableGradients> pushes;         // BatchPush
  embedding::CheckedPush checked;  // BatchPush: `pushes` as PrepareBatchPush checked them
  int64_t total_ids = 0;
  std::vector<std::vector<int64_t>> id_copies;
  std::vector<std::vector<int32_t>> offset_copies;
  std::vector<std::vector<float>> float_copies;

  // `checked` when it holds `pushes` as they are (PushOptions::checked); null for pushes
  // made otherwise (a step's merged parts, a push less its moved rows).
  const embedding::CheckedPush* checked_pushes() const {
    const bool same = checked.parts().data() == pushes.data() && checked.size() == pushes.size();
    return same && !pushes.empty() ? &checked : nullptr;
  }
};

// Decodes and checks every table of `request` (known table, whole values, bag offsets,
// weights with offsets and finite), adds one TableValues per table to `response`, sized
// for its answer, and points each part's `out` there. NotFound or InvalidArgument names
// the table; ResourceExhausted, before any answer is allocated, when the answers would
// hold more rows in all than `limit` allows. Without `size_answers` the TableValues are
// added (dim, rows) but no values are allocated, and each part's `out` stays empty (a
// coordinator forwarding its shards' answers).
absl::Status PrepareBatchLookup(const v1::BatchLookupRequest& request, const ConfigLookup& config,
                                const AnswerLimit& limit, v1::BatchLookupResponse* response,
                                DecodedBatch* batch, bool size_answers = true);

// The push `request` carries (BatchLookupRequest.push), before anything of it runs:
// InvalidArgument for a check round or a sync group's push, neither of which rides on a
// lookup, and for a push built on another shard map than its lookup (one could be applied
// and the other refused).
absl::Status CheckPushBeforeLookup(const v1::BatchLookupRequest& request);

// Decodes and checks every table of `request` (known table, gradients of ids x dim floats,
// all finite: the one scan of its values in this process), so that the push can be refused
// whole before any row changes. batch->checked holds the parts checked.
absl::Status PrepareBatchPush(const v1::BatchPushRequest& request, const ConfigLookup& config,
                              DecodedBatch* batch);

}  // namespace tessera::server

#endif  // TESSERA_SERVER_LOOKUP_REQUEST_H_
