#ifndef TESSERA_SERVER_PUSH_JOURNAL_H_
#define TESSERA_SERVER_PUSH_JOURNAL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "embedding/collection.h"
#include "tessera/v1/embedding_service.pb.h"

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
  // `table_of` (optional) names part i's table: an attempt that stops part-way keeps the
  // names of the parts it applied, for Applied().
  absl::StatusOr<std::vector<int64_t>> Run(
      const embedding::RequestId& id, size_t parts,
      const std::function<absl::Status(std::vector<int64_t>* done)>& apply,
      const std::function<std::string(size_t part)>& table_of = nullptr);

  // Run in two halves, for a push answered later on another thread (one that waits
  // without holding a thread). Begin: kDone, with every part's result, when an earlier
  // attempt applied the push whole; kBusy while another attempt with this id runs (it is
  // not waited for); else kRun, with the results of the parts applied so far, and the
  // caller must End it.
  enum class Began { kRun, kDone, kBusy };
  struct Claim {
    Began state = Began::kRun;
    std::vector<int64_t> done;
  };
  Claim Begin(const embedding::RequestId& id);
  // The attempt Begin claimed for `id` ended with `status`; `done` holds the results of
  // the parts applied (as Run's apply leaves them).
  void End(const embedding::RequestId& id, const absl::Status& status, std::vector<int64_t> done,
           const std::function<std::string(size_t part)>& table_of = nullptr);

  // A push held as applied: all its parts, or (complete false) the parts of `tables`.
  struct Applied {
    embedding::RequestId id;
    bool complete = false;
    std::vector<std::string> tables;
  };
  // Every idle id with a part applied (a reshard hands them to the next map's shards).
  std::vector<Applied> AppliedPushes() const;

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
    std::vector<std::string> tables;  // of the parts done, when incomplete
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

// Pushes applied under earlier shard maps (v1::AppliedPush, from every shard of the map
// before a reshard): a push retried under the new map skips the ids whose rows carry it
// already, wherever they moved. Keeps the newest `capacity`. Thread-safe.
class MovedPushes {
 public:
  explicit MovedPushes(size_t capacity = 1 << 18) : capacity_(capacity) {}

  void Add(const google::protobuf::RepeatedPtrField<v1::AppliedPush>& pushes);
  // Every push held (a later reshard hands them on).
  std::vector<v1::AppliedPush> All() const;
  // Those of request `id` (none: empty).
  std::vector<v1::AppliedPush> Of(const embedding::RequestId& id) const;
  bool empty() const;
  // Forgets every push (a restore replaced the rows).
  void Clear();
  // Every push held, as bytes that AddSerialized takes back (kept on disk, so that a
  // restarted shard still knows them).
  std::string Serialized() const;
  // Adds the pushes of Serialized() bytes; DataLoss for bytes that are not.
  absl::Status AddSerialized(absl::string_view bytes);

 private:
  using Key = std::pair<uint64_t, uint64_t>;
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::multimap<Key, v1::AppliedPush> pushes_ ABSL_GUARDED_BY(mu_);
  std::deque<Key> order_ ABSL_GUARDED_BY(mu_);  // oldest first, one per push added
};

// A push's id as journaled (and recorded) under shard map version `version`: `id` mixed
// with the version (up to version 1: as is), so that a push retried under a new map is not
// taken for its part under the old one. The mix is its own inverse.
embedding::RequestId JournalIdAt(const embedding::RequestId& id, uint64_t version);

// The pushes that durable records `parts` (EmbeddingCollection::RecordedPushes) say were
// applied under map `version`, by the shard at place `owner` of `num_shards`: one per
// request id (the client's), naming the tables of its recorded parts. Records of other
// versions are left out.
std::vector<v1::AppliedPush> RecordedUnder(absl::Span<const embedding::RecordedPart> parts,
                                           uint64_t version, int32_t owner, int32_t num_shards);

// True when `id` of `table` (config) is one of whose rows `applied` says it updated.
bool AppliedTo(const v1::AppliedPush& applied, const v1::TableConfig& table, int64_t id);

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PUSH_JOURNAL_H_
