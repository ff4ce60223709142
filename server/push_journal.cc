#include "server/push_journal.h"

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
    const std::function<absl::Status(std::vector<int64_t>* done)>& apply) {
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

size_t PushJournal::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace tessera::server
