#ifndef TESSERA_SERVER_PUSH_JOURNAL_H_
#define TESSERA_SERVER_PUSH_JOURNAL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "embedding/collection.h"

namespace tessera::server {

// The pushes a shard has applied, by request id, with their answers, so that a repeat (a
// client's retry, the coordinator's, a reconnect) is answered with the first answer
// instead of being applied again. A push has parts (the tables of a batch) applied in
// order; an attempt that fails part-way keeps the parts it applied, and the next attempt
// with the same id goes on from there. Only the newest `capacity` ids are kept.
// Thread-safe: a repeat that arrives while the first attempt runs waits for it.
class PushJournal {
 public:
  explicit PushJournal(size_t capacity = 1 << 16) : capacity_(capacity) {}

  // Applies request `id` through `apply`, which gets the results (rows updated) of the
  // parts already applied and appends one per part it applies, in order, stopping at its
  // first failure. Returns every part's result once all `parts` are applied, now or by an
  // earlier attempt, or apply's failure. An empty id is applied every time.
  absl::StatusOr<std::vector<int64_t>> Run(
      const embedding::RequestId& id, size_t parts,
      const std::function<absl::Status(std::vector<int64_t>* done)>& apply);

  // Forgets every idle id (the rows were replaced by a restore, so what they say was
  // applied no longer is).
  void Clear();

  // Ids held.
  size_t size() const;

 private:
  struct Entry {
    bool in_flight = false;
    bool complete = false;
    std::vector<int64_t> done;
  };
  using Key = std::pair<uint64_t, uint64_t>;
  // The entry of `key`, created (and the oldest idle one dropped past capacity) if new.
  std::shared_ptr<Entry> FindOrAdd(const Key& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  mutable absl::Mutex mu_;
  absl::CondVar finished_;
  std::map<Key, std::shared_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  std::deque<Key> order_ ABSL_GUARDED_BY(mu_);  // oldest first
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PUSH_JOURNAL_H_
