#include "server/change_log.h"

#include <algorithm>
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
    Entry entry{next_++, std::string(table), step, {part.begin(), part.end()}};
    newest_step_ = std::max(newest_step_, step);
    bytes_ += entry.bytes();
    entries_.push_back(std::move(entry));
  }
  // The oldest go for room; the newest stays even alone over the bound (a reader at the
  // head reads on from it), unless nothing is to be kept.
  while (!entries_.empty() && bytes_ > max_bytes_ && (entries_.size() > 1 || max_bytes_ == 0)) {
    bytes_ -= entries_.front().bytes();
    entries_.pop_front();
    ++dropped_;
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
}

ChangeLog::Cursor ChangeLog::Head() const {
  absl::MutexLock lock(&mu_);
  return {log_, next_ - 1};
}

absl::StatusOr<ChangeLog::Changes> ChangeLog::Read(const Cursor& after, size_t budget,
                                                   const IdCost& cost) const {
  absl::MutexLock lock(&mu_);
  const uint64_t first = entries_.empty() ? next_ : entries_.front().sequence;
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
  bool took = false;
  for (size_t i = after.sequence + 1 - first; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    const size_t each = cost == nullptr ? 1 : cost(e.table);
    if (each > 0) {
      if (took && spent >= budget) break;
      took = true;
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
