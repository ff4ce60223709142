#ifndef TESSERA_SERVER_CHANGE_LOG_H_
#define TESSERA_SERVER_CHANGE_LOG_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace tessera::server {

// A shard's log of the rows that changed, for serving replicas: the ids each applied push
// (or import) changed, in the order they were applied, each entry numbered in sequence.
// Ids only, not copies of the rows: a reader reads the rows as they are when it reads, so
// that what it reads of entries up to N reflects every change up to N (and perhaps later
// ones, whose entries follow). Bounded in bytes: past the bound, the oldest eighth of the
// entries is merged into one entry a table (the union of their ids: a reader whose cursor
// falls inside them reads every row changed after it, and perhaps a few before), which
// keeps a long history of a working set that pushes touch again and again; when that leaves
// less than 1/8 of the bound free, the oldest entries go, down to 3/4 of the bound, and a reader
// whose cursor is older than what is kept is told to start again from a snapshot. A log has an id,
// random at each start and made anew when rows change by other means (a restore, a dropped table):
// a cursor of another log is as old as one that fell out. Thread-safe.
class ChangeLog {
 public:
  // Ids an entry holds at most: a larger change is split into several.
  static constexpr size_t kMaxEntryIds = 1 << 12;

  // `max_bytes` 0: keeps nothing (Read refuses every cursor but the head's).
  explicit ChangeLog(size_t max_bytes);

  // Where a reader stands: it has read every entry of log `log` up to `sequence`.
  struct Cursor {
    uint64_t log = 0;
    uint64_t sequence = 0;
  };

  // `table` changed the rows of `ids` at `step` (-1: not a training step, as an import).
  void Append(absl::string_view table, int64_t step, absl::Span<const int64_t> ids);
  // Rows of `ids` came for the next shard map (a reshard's copy): appended at Publish, when
  // this shard serves them, and dropped by DropHeld (the reshard was given up).
  void Hold(absl::string_view table, absl::Span<const int64_t> ids);
  void Publish();
  void DropHeld();
  // Rows changed in ways the log does not tell (a restore): starts a new log.
  void Reset();

  // The newest entry's cursor.
  Cursor Head() const;

  struct Changes {
    Cursor reached;  // the last entry read (the cursor to read on from)
    Cursor head;     // the newest entry when read
    // Distinct ids changed per table, and the newest step among its entries read (-1: none
    // was a training step).
    std::map<std::string, std::vector<int64_t>> ids;
    std::map<std::string, int64_t> steps;
    int64_t entries = 0;     // entries read
    int64_t head_step = -1;  // the newest training step appended to this log
  };
  // What a distinct id of `table` costs a reader (bytes of its row, say); 0: the table is
  // not wanted, its entries are read past.
  using IdCost = std::function<size_t(const std::string& table)>;
  // The entries after `after`, whole, up to the first that takes the cost of the distinct
  // ids read to `budget` (at least one wanted entry), of the tables `cost` wants (null:
  // every table, each id costing 1). OutOfRange, saying to start again from a snapshot,
  // when `after` is of another log or older than the oldest entry kept.
  absl::StatusOr<Changes> Read(const Cursor& after, size_t budget, const IdCost& cost) const;

  // False for a log bounded to 0 bytes, which keeps nothing.
  bool keeps() const { return max_bytes_ > 0; }
  // Bytes the entries take now, entries kept, and the sequences no longer covered (dropped
  // for room: the oldest cursor a reader may hold is dropped()).
  size_t bytes() const;
  size_t entries() const;
  int64_t dropped() const;

 private:
  // The ids `table` changed in sequences [from, sequence]. Merged entries (one a table)
  // share their sequence: a reader takes such a group whole.
  struct Entry {
    uint64_t sequence = 0;
    uint64_t from = 0;
    std::string table;
    int64_t step = -1;
    std::vector<int64_t> ids;
    size_t bytes() const { return sizeof(Entry) + table.size() + ids.size() * sizeof(int64_t); }
  };
  void AppendLocked(absl::string_view table, int64_t step, absl::Span<const int64_t> ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Back under the bound: the oldest eighth merged, then the oldest groups dropped.
  void MakeRoom() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The oldest `n` entries (whole groups) as one entry a table.
  void MergeOldest(size_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_bytes_;
  mutable absl::Mutex mu_;
  uint64_t log_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;  // the next entry's sequence
  std::deque<Entry> entries_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t newest_step_ ABSL_GUARDED_BY(mu_) = -1;
  std::map<std::string, std::vector<int64_t>> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_CHANGE_LOG_H_
