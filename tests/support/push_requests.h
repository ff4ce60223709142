#ifndef TESSERA_TESTS_SUPPORT_PUSH_REQUESTS_H_
#define TESSERA_TESTS_SUPPORT_PUSH_REQUESTS_H_

// Raw BatchPush requests, as a client of another language would send them.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "tessera/v1/embedding_service.pb.h"
#include "wire/packed_bytes.h"

namespace tessera::testing {

// One data-parallel worker's part of a step: who sends it and in which step.
struct SyncPart {
  std::string job;  // the sync group, registered beforehand
  int worker = 0;
  int workers = 2;
  uint64_t client = 0;  // the request id
  uint64_t sequence = 0;
  int64_t step = 0;
};

// `part`'s push of gradient 1 (dim floats a row) to `ids` of `table`, waiting up to 20 s
// for the other workers' parts.
inline v1::BatchPushRequest SyncPushRequest(const SyncPart& part, const std::string& table,
                                            absl::Span<const int64_t> ids, int dim) {
  v1::BatchPushRequest r;
  r.set_step(part.step);
  r.mutable_request_id()->set_client_id(part.client);
  r.mutable_request_id()->set_sequence(part.sequence);
  r.mutable_sync()->set_job(part.job);
  r.mutable_sync()->set_worker(part.worker);
  r.mutable_sync()->set_workers(part.workers);
  r.mutable_sync()->set_timeout_ms(20000);
  v1::TableGradients* t = r.add_tables();
  t->set_table(table);
  wire::SetPacked<int64_t>(ids, t->mutable_ids());
  wire::SetPacked<float>(std::vector<float>(ids.size() * dim, 1.0f), t->mutable_gradients());
  return r;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_SUPPORT_PUSH_REQUESTS_H_
