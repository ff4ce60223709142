#ifndef TESSERA_SERVER_SYNC_GROUPS_H_
#define TESSERA_SERVER_SYNC_GROUPS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace tessera::server {

// The sync groups of data-parallel jobs that registered (RegisterSyncGroup): a server
// refuses a push of a group no job registered, or with another worker count, at once
// instead of holding it for workers that never come. Holds the `capacity` groups used
// last (a registration or a push uses one). Thread-safe.
class SyncGroups {
 public:
  // Workers a group may have: more is InvalidArgument (a step holds a slot per worker).
  static constexpr int kMaxWorkers = 4096;

  // `where` is what errors call this server: "shard 1".
  explicit SyncGroups(std::string where, size_t capacity = 4096)
      : where_(std::move(where)), capacity_(capacity) {}

  // Registers `job` as a group of `workers` (again: its count replaced). InvalidArgument
  // for a job name that is empty or over 256 bytes, or a count outside [2, kMaxWorkers].
  absl::Status Register(const std::string& job, int workers);
  // OK when `job` is registered with `workers` workers; FailedPrecondition saying what to
  // do otherwise.
  absl::Status Check(const std::string& job, int workers);

  size_t size() const;

 private:
  struct Group {
    int workers = 0;
    uint64_t used = 0;  // tick of its last use
  };
  const std::string where_;
  const size_t capacity_;
  mutable absl::Mutex mu_;
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, Group> groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_SYNC_GROUPS_H_
