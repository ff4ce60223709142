#include "server/push_journal.h"

#include <algorithm>

#include "embedding/embedding_table.h"
#include "google/protobuf/util/message_differencer.h"

namespace tessera::server {

std::shared_ptr<PushJournal::Entry> PushJournal::FindOrAdd(const Key& key) {
  auto [it, inserted] = entries_.try_emplace(key);
  if (!inserted) return it->second;
  it->second = std::make_shared<Entry>();
  order_.push_back(key);
  // Drop the oldest ids that no attempt is running; one in flight stays until it ends.
  for (size_t scanned = 0; entries_.size() > capacity_ && scanned < order_.size();) {
    auto old = entries_.find(order_.front());
    if (old != entries_.end() && old->second->in_flight) {
      order_.push_back(order_.front());
      order_.pop_front();
      ++scanned;
      continue;
    }
    if (old != entries_.end()) entries_.erase(old);
    order_.pop_front();
  }
  return it->second;
}

absl::StatusOr<std::vector<int64_t>> PushJournal::Run(
    const embedding::RequestId& id, size_t parts,
    const std::function<absl::Status(std::vector<int64_t>* done)>& apply,
    const std::function<std::string(size_t part)>& table_of) {
  if (id.empty()) {
    std::vector<int64_t> done;
    absl::Status s = apply(&done);
    if (!s.ok()) return s;
    return done;
  }
  std::shared_ptr<Entry> e;
  std::vector<int64_t> done;
  {
    absl::MutexLock lock(&mu_);
    e = FindOrAdd({id.client_id, id.sequence});
    while (e->in_flight) finished_.Wait(&mu_);
    if (e->complete) return e->done;
    e->in_flight = true;
    done = e->done;
  }
  absl::Status s = done.size() < parts ? apply(&done) : absl::OkStatus();
  absl::MutexLock lock(&mu_);
  e->done = done;
  e->in_flight = false;
  e->complete = s.ok();
  e->tables.clear();
  if (!e->complete && table_of != nullptr) {
    for (size_t i = 0; i < done.size(); ++i) e->tables.push_back(table_of(i));
  }
  finished_.SignalAll();
  if (!s.ok()) return s;
  return done;
}

void PushJournal::Clear() {
  absl::MutexLock lock(&mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    it = it->second->in_flight ? std::next(it) : entries_.erase(it);
  }
  std::deque<Key> kept;
  for (const Key& k : order_) {
    if (entries_.count(k) > 0) kept.push_back(k);
  }
  order_ = std::move(kept);
}

std::vector<PushJournal::Applied> PushJournal::AppliedPushes() const {
  absl::MutexLock lock(&mu_);
  std::vector<Applied> out;
  for (const auto& [key, e] : entries_) {
    if (e->in_flight || (!e->complete && e->done.empty())) continue;
    out.push_back(Applied{{key.first, key.second}, e->complete, e->tables});
  }
  return out;
}

size_t PushJournal::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

void MovedPushes::Add(const google::protobuf::RepeatedPtrField<v1::AppliedPush>& pushes) {
  absl::MutexLock lock(&mu_);
  for (const v1::AppliedPush& p : pushes) {
    const Key key{p.request_id().client_id(), p.request_id().sequence()};
    if (key.first == 0 || key.second == 0) continue;
    bool held = false;
    for (auto [it, end] = pushes_.equal_range(key); it != end && !held; ++it) {
      held = google::protobuf::util::MessageDifferencer::Equals(it->second, p);
    }
    if (held) continue;  // a repeated COMMIT
    pushes_.emplace(key, p);
    order_.push_back(key);
  }
  while (order_.size() > capacity_) {
    auto it = pushes_.find(order_.front());
    if (it != pushes_.end()) pushes_.erase(it);
    order_.pop_front();
  }
}

std::vector<v1::AppliedPush> MovedPushes::All() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::AppliedPush> out;
  out.reserve(pushes_.size());
  for (const auto& [key, p] : pushes_) out.push_back(p);
  return out;
}

std::vector<v1::AppliedPush> MovedPushes::Of(const embedding::RequestId& id) const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::AppliedPush> out;
  for (auto [it, end] = pushes_.equal_range({id.client_id, id.sequence}); it != end; ++it) {
    out.push_back(it->second);
  }
  return out;
}

void MovedPushes::Clear() {
  absl::MutexLock lock(&mu_);
  pushes_.clear();
  order_.clear();
}

bool MovedPushes::empty() const {
  absl::MutexLock lock(&mu_);
  return pushes_.empty();
}

bool AppliedTo(const v1::AppliedPush& applied, const v1::TableConfig& table, int64_t id) {
  if (applied.tables_size() > 0 &&
      std::find(applied.tables().begin(), applied.tables().end(), table.name()) ==
          applied.tables().end()) {
    return false;
  }
  return embedding::ShardOfRow(table, id, std::max(1, applied.num_shards())) == applied.owner();
}

}  // namespace tessera::server
