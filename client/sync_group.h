#ifndef TESSERA_CLIENT_SYNC_GROUP_H_
#define TESSERA_CLIENT_SYNC_GROUP_H_

// A data-parallel worker's sync group on the wire (v1::SyncGroup), and how long a push in
// one may take: a shard answers it once every worker has pushed, so its deadline is the
// group's wait on top of the usual one.

#include <algorithm>
#include <chrono>

#include "embedding/collection.h"
#include "tessera/v1/embedding_service.pb.h"

namespace tessera::client {

inline void SetSyncGroup(const embedding::PushSync& sync, v1::SyncGroup* out) {
  out->set_job(sync.job);
  out->set_worker(sync.worker);
  out->set_workers(sync.workers);
  out->set_timeout_ms(
      static_cast<int32_t>(std::clamp<int64_t>(sync.timeout.count(), 1, int64_t{3600} * 1000)));
}

inline std::chrono::milliseconds SyncDeadline(const embedding::PushSync& sync,
                                              std::chrono::milliseconds deadline) {
  return sync.timeout + deadline;
}

}  // namespace tessera::client

#endif  // TESSERA_CLIENT_SYNC_GROUP_H_
