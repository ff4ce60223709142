#include "server/push_journal.h"

#include <algorithm>
#include <set>

#include "embedding/embedding_table.h"
#include "embedding/sharding.h"
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

PushJournal::Claim PushJournal::Begin(const embedding::RequestId& id) {
  Claim claim;
  if (id.empty()) return claim;
  absl::MutexLock lock(&mu_);
  std::shared_ptr<Entry> e = FindOrAdd({id.client_id, id.sequence});
  if (e->in_flight) {
    claim.state = Began::kBusy;
    return claim;
  }
  claim.done = e->done;
  if (e->complete) {
    claim.state = Began::kDone;
  } else {
    e->in_flight = true;
  }
  return claim;
}

void PushJournal::End(const embedding::RequestId& id, const absl::Status& status,
                      std::vector<int64_t> done,
                      const std::function<std::string(size_t part)>& table_of) {
  if (id.empty()) return;
  absl::MutexLock lock(&mu_);
  // An entry in flight is never dropped (FindOrAdd, Clear): it is still here.
  auto it = entries_.find({id.client_id, id.sequence});
  if (it == entries_.end()) return;
  Entry& e = *it->second;
  e.done = std::move(done);
  e.in_flight = false;
  e.complete = status.ok();
  e.tables.clear();
  if (!e.complete && table_of != nullptr) {
    for (size_t i = 0; i < e.done.size(); ++i) e.tables.push_back(table_of(i));
  }
  finished_.SignalAll();
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
  std::vector<int64_t> done;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Entry> e = FindOrAdd({id.client_id, id.sequence});
    while (e->in_flight) finished_.Wait(&mu_);
    if (e->complete) return e->done;
    e->in_flight = true;
    done = e->done;
  }
  absl::Status s = done.size() < parts ? apply(&done) : absl::OkStatus();
  End(id, s, done, table_of);
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

std::string MovedPushes::Serialized() const {
  // The pushes as a COMMIT hands them over.
  v1::ReshardRequest kept;
  for (v1::AppliedPush& p : All()) *kept.add_applied() = std::move(p);
  return kept.SerializeAsString();
}

absl::Status MovedPushes::AddSerialized(absl::string_view bytes) {
  v1::ReshardRequest kept;
  if (!kept.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError("the pushes kept from earlier reshards cannot be read");
  }
  Add(kept.applied());
  return absl::OkStatus();
}

embedding::RequestId JournalIdAt(const embedding::RequestId& id, uint64_t version) {
  if (id.empty() || version <= 1) return id;
  embedding::RequestId out = id;
  out.client_id ^= embedding::Mix64(version ^ 0x6a09e667f3bcc908ULL);
  if (out.client_id == 0) out.client_id = 1;
  return out;
}

std::vector<v1::AppliedPush> RecordedUnder(absl::Span<const embedding::RecordedPart> parts,
                                           uint64_t version, int32_t owner, int32_t num_shards) {
  std::map<std::pair<uint64_t, uint64_t>, std::set<std::string>> tables;
  for (const embedding::RecordedPart& part : parts) {
    if (part.tag.map_version != version || version == 0 || part.table.empty()) continue;
    const embedding::RequestId client = JournalIdAt(part.tag.request, version);
    tables[{client.client_id, client.sequence}].insert(part.table);
  }
  std::vector<v1::AppliedPush> out;
  for (const auto& [id, names] : tables) {
    v1::AppliedPush& p = out.emplace_back();
    p.mutable_request_id()->set_client_id(id.first);
    p.mutable_request_id()->set_sequence(id.second);
    p.set_owner(owner);
    p.set_num_shards(num_shards);
    for (const std::string& t : names) p.add_tables(t);
  }
  return out;
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
