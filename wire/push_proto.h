#ifndef TESSERA_WIRE_PUSH_PROTO_H_
#define TESSERA_WIRE_PUSH_PROTO_H_

// A push's request id (v1::RequestId) and a data-parallel worker's sync group
// (v1::SyncGroup) on the wire, each converted here once, and how long a push in a group may
// take: a shard answers it once every worker has pushed, so its deadline is the group's
// wait on top of the usual one.

#include <algorithm>
#include <chrono>

#include "embedding/collection.h"
#include "tessera/v1/embedding_service.pb.h"

namespace tessera::wire {

inline void ToProto(const embedding::RequestId& id, v1::RequestId* out) {
  out->set_client_id(id.client_id);
  out->set_sequence(id.sequence);
}

inline embedding::RequestId RequestIdOf(const v1::RequestId& id) {
  return {id.client_id(), id.sequence()};
}

// The longest a shard waits for a group's other workers: an hour.
inline constexpr int64_t kMaxSyncTimeoutMs = int64_t{3600} * 1000;

inline void ToProto(const embedding::PushSync& sync, v1::SyncGroup* out) {
  out->set_job(sync.job);
  out->set_worker(sync.worker);
  out->set_workers(sync.workers);
  out->set_timeout_ms(
      static_cast<int32_t>(std::clamp<int64_t>(sync.timeout.count(), 1, kMaxSyncTimeoutMs)));
}

// A request's group; no group (one worker) when it has none. The wait is clamped to
// [1 ms, an hour].
inline embedding::PushSync PushSyncOf(const v1::BatchPushRequest& request) {
  embedding::PushSync sync;
  if (!request.has_sync()) return sync;
  const v1::SyncGroup& group = request.sync();
  sync.job = group.job();
  sync.worker = group.worker();
  sync.workers = group.workers();
  sync.timeout = std::chrono::milliseconds(
      std::clamp<int64_t>(group.timeout_ms(), 1, kMaxSyncTimeoutMs));
  return sync;
}

inline std::chrono::milliseconds SyncDeadline(const embedding::PushSync& sync,
                                              std::chrono::milliseconds deadline) {
  return sync.timeout + deadline;
}

}  // namespace tessera::wire

#endif  // TESSERA_WIRE_PUSH_PROTO_H_
