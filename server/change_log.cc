#include "server/change_log.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "embedding/collection.h"

namespace tessera::server {

ChangeLog::ChangeLog(size_t max_bytes)
    : max_bytes_(max_bytes), log_(embedding::RandomNonZeroId()) {}

void ChangeLog::Append(absl::string_view table, int64_t step, absl::Span<const int64_t> ids) {
  if (ids.empty()) return;
  absl::MutexLock lock(&mu_);
  AppendLocked(table, step, ids);
}

void ChangeLog::AppendLocked(absl::string_view table, int64_t step, absl::Span<const int64_t> ids) {
  for (size_t at = 0; at < ids.size(); at += kMaxEntryIds) {
    const absl::Span<const int64_t> part = ids.subspan(at, kMaxEntryIds);
    const uint64_t sequence = next_++;
    Entry entry{sequence, sequence, std::string(table), step, {part.begin(), part.end()}};
    newest_step_ = std::max(newest_step_, step);
    bytes_ += entry.bytes();
    entries_.push_back(std::move(entry));
  }
  if (bytes_ > max_bytes_) MakeRoom();
}

void ChangeLog::MakeRoom() {
  // The oldest eighth at a time (with what was merged before), whole groups, the newest
  // entry apart (a reader at the head reads on from it), while merging frees room: the
  // pushes appending meanwhile wait for a part, not the whole log, at a time.
  const size_t goal = max_bytes_ / 8 * 7;
  for (int merges = 0; max_bytes_ > 0 && bytes_ > goal && entries_.size() > 2 && merges < 8;
       ++merges) {
    size_t n = std::max<size_t>(2, entries_.size() / 8);
    while (n < entries_.size() - 1 && entries_[n].sequence == entries_[n - 1].sequence) ++n;
    if (n >= entries_.size()) break;
    const size_t before = bytes_;
    MergeOldest(n);
    if (before - std::min(before, bytes_) < max_bytes_ / 64) break;  // little left to win
  }
  // Not 1/8 of the bound free: the oldest groups go, down to 3/4 of it (room for the next
  // appends before another merge); the newest stays even alone over the bound, unless
  // nothing is to be kept.
  if (bytes_ <= goal && max_bytes_ > 0) return;
  const size_t target = max_bytes_ / 4 * 3;
  while (!entries_.empty() && bytes_ > target && (entries_.size() > 1 || max_bytes_ == 0)) {
    const uint64_t group = entries_.front().sequence;
    while (!entries_.empty() && entries_.front().sequence == group) {
      bytes_ -= entries_.front().bytes();
      entries_.pop_front();
    }
    dropped_ = static_cast<int64_t>(group);
  }
}

void ChangeLog::MergeOldest(size_t n) {
  const uint64_t from = entries_.front().from;
  const uint64_t through = entries_[n - 1].sequence;
  std::map<std::string, std::pair<absl::flat_hash_set<int64_t>, int64_t>> tables;
  for (size_t i = 0; i < n; ++i) {
    auto& [ids, step] =
        tables.try_emplace(entries_[i].table, absl::flat_hash_set<int64_t>(), -1).first->second;
    ids.insert(entries_[i].ids.begin(), entries_[i].ids.end());
    step = std::max(step, entries_[i].step);
    bytes_ -= entries_[i].bytes();
  }
  entries_.erase(entries_.begin(), entries_.begin() + static_cast<std::ptrdiff_t>(n));
  for (auto it = tables.rbegin(); it != tables.rend(); ++it) {
    Entry merged{through,
                 from,
                 it->first,
                 it->second.second,
                 {it->second.first.begin(), it->second.first.end()}};
    bytes_ += merged.bytes();
    entries_.push_front(std::move(merged));
  }
}

void ChangeLog::Hold(absl::string_view table, absl::Span<const int64_t> ids) {
  absl::MutexLock lock(&mu_);
  std::vector<int64_t>& held = held_[std::string(table)];
  held.insert(held.end(), ids.begin(), ids.end());
}

void ChangeLog::Publish() {
  absl::MutexLock lock(&mu_);
  for (auto& [table, ids] : held_) AppendLocked(table, -1, ids);
  held_.clear();
}

void ChangeLog::DropHeld() {
  absl::MutexLock lock(&mu_);
  held_.clear();
}

void ChangeLog::Reset() {
  absl::MutexLock lock(&mu_);
  log_ = embedding::RandomNonZeroId();
  next_ = 1;
  entries_.clear();
  bytes_ = 0;
  held_.clear();
  newest_step_ = -1;
  dropped_ = 0;
}

ChangeLog::Cursor ChangeLog::Head() const {
  absl::MutexLock lock(&mu_);
  return {log_, next_ - 1};
}

absl::StatusOr<ChangeLog::Changes> ChangeLog::Read(const Cursor& after, size_t budget,
                                                   const IdCost& cost) const {
  absl::MutexLock lock(&mu_);
  const uint64_t first = entries_.empty() ? next_ : entries_.front().from;
  if (after.log != log_) {
    return absl::OutOfRangeError(
        absl::StrCat("change log ", after.log,
                     " is gone (the shard restarted, or rows were restored or "
                     "dropped since): start again from a snapshot"));
  }
  if (after.sequence >= next_) {
    return absl::InvalidArgumentError(
        absl::StrCat("change ", after.sequence, " is past the newest, ", next_ - 1));
  }
  if (after.sequence + 1 < first) {
    return absl::OutOfRangeError(absl::StrCat(
        "changes ", after.sequence + 1, " to ", first - 1,
        " fell out of the shard's change log (its bound, tessera-shard --change_log_bytes, "
        "keeps ",
        first, " on): start again from a snapshot"));
  }
  Changes changes;
  changes.head = {log_, next_ - 1};
  changes.reached = after;
  changes.head_step = newest_step_;
  std::map<std::string, absl::flat_hash_set<int64_t>> seen;
  size_t spent = 0;
  uint64_t taken = 0;  // the sequence of the last wanted entry read (a group is read whole)
  auto start = std::partition_point(entries_.begin(), entries_.end(),
                                    [&](const Entry& e) { return e.sequence <= after.sequence; });
  for (auto it = start; it != entries_.end(); ++it) {
    const Entry& e = *it;
    const size_t each = cost == nullptr ? 1 : cost(e.table);
    if (each > 0) {
      if (taken != 0 && spent >= budget && e.sequence != taken) break;
      taken = e.sequence;
      absl::flat_hash_set<int64_t>& ids = seen[e.table];
      std::vector<int64_t>& out = changes.ids[e.table];
      for (const int64_t id : e.ids) {
        if (ids.insert(id).second) {
          out.push_back(id);
          spent += each;
        }
      }
      int64_t& step = changes.steps.try_emplace(e.table, -1).first->second;
      step = std::max(step, e.step);
    }
    ++changes.entries;
    changes.reached.sequence = e.sequence;
  }
  return changes;
}

size_t ChangeLog::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

size_t ChangeLog::entries() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

int64_t ChangeLog::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

}  // namespace tessera::server
