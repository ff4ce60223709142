#ifndef TESSERA_SERVER_RENDEZVOUS_STORE_H_
#define TESSERA_SERVER_RENDEZVOUS_STORE_H_

// The coordinator's in-memory key-value store for the rendezvous of data-parallel
// trainers: each worker sets the address its collective transport listens on and waits
// for the others' (gloo's rendezvous::Store over the StoreSet/StoreGet/StoreAdd RPCs).

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tessera::server {

struct RendezvousLimits {
  size_t max_key_bytes = 1024;
  size_t max_value_bytes = 1 << 20;
  size_t max_keys = 1 << 16;
  std::chrono::milliseconds max_wait{10 * 60 * 1000};
};

// Thread-safe.
class RendezvousStore {
 public:
  explicit RendezvousStore(RendezvousLimits limits = {}) : limits_(limits) {}

  // Sets `key` to `value` (replacing it). InvalidArgument for an empty or oversized key or
  // value, ResourceExhausted when the store holds max_keys keys already.
  absl::Status Set(const std::string& key, std::string value);

  // The values of `keys` once every one exists, waiting at most `timeout` (capped at
  // max_wait); DeadlineExceeded names the keys still missing then.
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               std::chrono::milliseconds timeout);

  // Adds `delta` to the counter at `key` (0 when absent) and returns the new value.
  // FailedPrecondition when `key` holds a value that is not a counter.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);

  size_t size() const;

 private:
  absl::Status CheckKey(const std::string& key) const;
  absl::Status CheckRoom(const std::string& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RendezvousLimits limits_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_RENDEZVOUS_STORE_H_
