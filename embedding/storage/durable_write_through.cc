// DurableCollection's pushes: recorded request ids, and write-through tables' rows written
// to the store with every push.

#include <algorithm>
#include <map>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "embedding/batch_ops.h"
#include "embedding/sharding.h"
#include "embedding/storage/durable_collection.h"
#include "embedding/storage/files.h"
#include "embedding/storage/row_codec.h"

namespace tessera::storage {

absl::Status DurableCollection::PushGradients(absl::string_view table,
                                              absl::Span<const int64_t> ids,
                                              absl::Span<const float> gradients, int64_t step) {
  return Push(table, ids, gradients, step, nullptr);
}

absl::Status DurableCollection::PushBatch(absl::Span<const embedding::TableGradients> tables,
                                          int64_t step, const embedding::PushOptions& options) {
  TESSERA_RETURN_IF_ERROR(embedding::RefuseSync(options));
  absl::ReaderMutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(Usable());
  std::vector<const Table*> through(tables.size(), nullptr);
  bool any = false;
  for (size_t i = 0; i < tables.size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(const Table* t, Find(tables[i].table));
    if (t->config.durability() == v1::WRITE_THROUGH) through[i] = t;
    any = any || through[i] != nullptr;
  }
  // Without write-through parts the memory tables are all there is (a checkpoint writes them).
  if (options.check_only || !any) return memory_->PushBatch(tables, step, options);
  return WriteThroughBatch(tables, through, step, options);
}

absl::Status DurableCollection::PushGradientsRecorded(absl::string_view table,
                                                      absl::Span<const int64_t> ids,
                                                      absl::Span<const float> gradients,
                                                      int64_t step, const embedding::PushTag& tag) {
  return Push(table, ids, gradients, step, &tag);
}

absl::Status DurableCollection::Push(absl::string_view table, absl::Span<const int64_t> ids,
                                     absl::Span<const float> gradients, int64_t step,
                                     const embedding::PushTag* tag) {
  absl::ReaderMutexLock lock(&mu_);
  TESSERA_ASSIGN_OR_RETURN(const Table* t, Find(table));
  if (t->config.durability() != v1::WRITE_THROUGH) {
    return memory_->PushGradients(table, ids, gradients, step);
  }
  return WriteThroughPush(*t, ids, gradients, step, tag);
}

std::optional<int64_t> DurableCollection::RecordedPush(const embedding::PushTag& tag) const {
  absl::MutexLock lock(&record_mu_);
  auto it = records_.find(KeyOf(tag));
  if (it == records_.end()) return std::nullopt;
  return it->second.rows;
}

std::vector<embedding::RecordedPart> DurableCollection::RecordedPushes() const {
  absl::MutexLock lock(&record_mu_);
  std::vector<embedding::RecordedPart> out;
  out.reserve(records_.size());
  for (const auto& [key, record] : records_) {
    const auto& [client, sequence, part] = key;
    out.push_back(embedding::RecordedPart{
        embedding::PushTag{{client, sequence}, part, record.map_version}, record.table});
  }
  return out;
}

namespace {
std::string ServerStateKey(absl::string_view key) { return MetaKey(absl::StrCat("server.", key)); }
}  // namespace

absl::Status DurableCollection::KeepServerState(absl::string_view key, absl::string_view value) {
  absl::ReaderMutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(Usable());
  return Annotate(store_->Write({KvWrite{ServerStateKey(key), std::string(value)}}, /*sync=*/true),
                  absl::StrCat("keeping '", key, "'"));
}

absl::StatusOr<std::string> DurableCollection::ServerState(absl::string_view key) const {
  absl::ReaderMutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(Usable());
  absl::StatusOr<std::optional<std::string>> value = store_->Get(ServerStateKey(key));
  if (!value.ok()) return Annotate(value.status(), absl::StrCat("reading '", key, "'"));
  return value->value_or(std::string());
}

absl::Status DurableCollection::LoadPushRecords() {
  std::vector<std::tuple<uint64_t, embedding::PushTag, Record>> found;  // order, tag, record
  TESSERA_RETURN_IF_ERROR(
      Annotate(store_->Scan(PushRecordPrefix(),
                            [&](absl::string_view key, absl::string_view value) {
                              embedding::PushTag tag;
                              PushRecordValue v;
                              if (!ParsePushRecordKey(key, &tag) || !DecodePushRecord(value, &v)) {
                                return absl::DataLossError("malformed push record in the store");
                              }
                              tag.map_version = v.map_version;
                              found.emplace_back(v.order, tag,
                                                 Record{v.rows, v.map_version, std::move(v.table)});
                              return absl::OkStatus();
                            }),
               "reading the push records"));
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
  std::vector<KvWrite> trimmed;
  while (found.size() - trimmed.size() > options_.push_records) {
    trimmed.push_back(KvWrite{PushRecordKey(std::get<1>(found[trimmed.size()])), "", true});
  }
  if (!trimmed.empty()) TESSERA_RETURN_IF_ERROR(store_->Write(trimmed, /*sync=*/true));
  absl::MutexLock lock(&record_mu_);
  records_.clear();
  record_order_.clear();
  next_record_ = found.empty() ? 1 : std::get<0>(found.back()) + 1;
  for (size_t i = trimmed.size(); i < found.size(); ++i) {
    auto& [order, tag, record] = found[i];
    records_[KeyOf(tag)] = std::move(record);
    record_order_.push_back(tag);
  }
  return absl::OkStatus();
}

absl::Status DurableCollection::SnapshotPart(const Table& t, absl::Span<const int64_t> ids,
                                             absl::Span<const float> gradients,
                                             embedding::Gradients given, WrittenPart* part) const {
  const std::string& name = t.config.name();
  part->t = &t;
  TESSERA_RETURN_IF_ERROR(
      embedding::SumGradients(name, ids, gradients, t.config.dim(), &part->summed, given));
  const auto& shards = *memory_->ShardsOf(name);
  const int sf = shards[0]->optimizer().StateFloats();
  const int dim = t.config.dim();
  part->before.clear();
  for (const int64_t id : part->summed.ids()) {
    part->before[id];
    shards[embedding::ShardOfRow(t.config, id, options_.num_shards, options_.cluster_num_shards)]
        ->ReadRows({&id, 1},
                   [&](int64_t rid, const float* w, const float* s, const embedding::RowMeta& m) {
                     Before& b = part->before[rid];
                     b.existed = true;
                     b.weights.assign(w, w + dim);
                     b.state.assign(s, s + sf);
                     b.meta = m;
                   });
  }
  return absl::OkStatus();
}

void DurableCollection::UndoPart(const WrittenPart& part) const {
  const auto& shards = *memory_->ShardsOf(part.t->config.name());
  for (const auto& [id, b] : part.before) {
    auto& shard = shards[embedding::ShardOfRow(part.t->config, id, options_.num_shards,
                                               options_.cluster_num_shards)];
    // A row that cannot be put back (out of memory) is forgotten instead: its next read
    // finds its stored value, which the refused write did not change.
    if (!b.existed || !shard->PutRow(id, b.weights, b.state, b.meta).ok()) shard->Forget(id);
  }
}

void DurableCollection::AppendPartWrites(const WrittenPart& part, const embedding::PushTag* tag,
                                         std::vector<KvWrite>* writes) {
  const std::string& name = part.t->config.name();
  AppendRowWrites(*part.t, *memory_->ShardsOf(name), options_.cluster_num_shards, part.summed.ids(),
                  writes);
  if (tag == nullptr) return;
  // The record goes in the same write as the rows: after a crash both are there or
  // neither is. The oldest records beyond the limit go with it (a failed write leaves them
  // in the store; the next open trims them).
  absl::MutexLock lock(&record_mu_);
  writes->push_back(
      KvWrite{PushRecordKey(*tag),
              EncodePushRecord({next_record_++, static_cast<int64_t>(part.summed.size()),
                                tag->map_version, name})});
  while (!record_order_.empty() && record_order_.size() + 1 > options_.push_records) {
    writes->push_back(KvWrite{PushRecordKey(record_order_.front()), "", /*erase=*/true});
    records_.erase(KeyOf(record_order_.front()));
    record_order_.pop_front();
  }
}

void DurableCollection::HoldRecords(std::vector<std::pair<embedding::PushTag, Record>> written) {
  absl::MutexLock lock(&record_mu_);
  for (auto& [tag, record] : written) {
    records_[KeyOf(tag)] = std::move(record);
    record_order_.push_back(tag);
  }
}

absl::Status DurableCollection::WriteThroughBatch(
    absl::Span<const embedding::TableGradients> tables, const std::vector<const Table*>& through,
    int64_t step, const embedding::PushOptions& options) {
  // Each write-through table's pushes in order, its lock taken in table id order.
  std::map<uint32_t, absl::Mutex*> locks;
  for (const Table* t : through) {
    if (t != nullptr) locks[t->id] = t->write_mu.get();
  }
  std::vector<std::unique_ptr<absl::MutexLock>> held;
  for (auto& [id, mu] : locks) held.push_back(std::make_unique<absl::MutexLock>(mu));
  embedding::PushOptions check;
  check.check_only = true;
  check.checked = options.checked;
  TESSERA_RETURN_IF_ERROR(memory_->PushBatch(tables, step, check));
  // Every part is checked now: their sums are checked only where ids repeat.
  const size_t n = tables.size();
  std::vector<int64_t> rows(n, 0);
  std::vector<std::unique_ptr<WrittenPart>> parts;  // applied in memory, in part order
  std::vector<KvWrite> writes;
  std::vector<std::pair<embedding::PushTag, Record>> records;
  for (size_t i = 0; i < n; ++i) {
    if (through[i] == nullptr) continue;
    const embedding::PushTag tag{options.request_id, static_cast<uint32_t>(i), options.map_version};
    const bool tagged = !options.request_id.empty();
    if (std::optional<int64_t> done = tagged ? RecordedPush(tag) : std::nullopt; done) {
      rows[i] = *done;  // applied and written before (a retry after a restart)
      continue;
    }
    parts.push_back(std::make_unique<WrittenPart>());
    WrittenPart& part = *parts.back();
    absl::Status s = SnapshotPart(*through[i], tables[i].ids, tables[i].gradients,
                                  embedding::Gradients::kChecked, &part);
    if (s.ok()) s = memory_->PushSummed(tables[i].table, part.summed, step);
    if (!s.ok()) {
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) UndoPart(**it);
      return absl::Status(s.code(), absl::StrCat(s.message(),
                                                 " [a push with write-through tables: undone "
                                                 "whole, no row of it changed]"));
    }
    rows[i] = static_cast<int64_t>(part.summed.size());
    AppendPartWrites(part, tagged ? &tag : nullptr, &writes);
    if (tagged) records.emplace_back(tag, Record{rows[i], tag.map_version, tables[i].table});
  }
  if (absl::Status s = store_->Write(writes, /*sync=*/true); !s.ok()) {
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) UndoPart(**it);
    return absl::Status(s.code(), absl::StrCat("write-through push not applied, the disk "
                                               "refused it (no row of it changed): ",
                                               s.message()));
  }
  HoldRecords(std::move(records));
  // The other parts: checked with the rest, so they fail only as a push never does here.
  std::vector<embedding::TableGradients> rest;
  std::vector<size_t> rest_index;
  for (size_t i = 0; i < n; ++i) {
    if (through[i] != nullptr) continue;
    rest.push_back(tables[i]);
    rest_index.push_back(i);
  }
  std::vector<int64_t> rest_rows;
  absl::Status s;
  if (!rest.empty()) {
    embedding::PushOptions memory;
    memory.rows_updated = &rest_rows;
    s = memory_->PushBatch(rest, step, memory);
    if (!s.ok() && !tessera::IsPartlyApplied(s)) {
      return absl::Status(s.code(), absl::StrCat(s.message(),
                                                 " [its write-through tables' "
                                                 "parts were applied and written; a repeat "
                                                 "under the same request id applies the rest]"));
    }
    for (size_t j = 0; j < rest_index.size() && j < rest_rows.size(); ++j) {
      rows[rest_index[j]] = rest_rows[j];
    }
  }
  if (options.rows_updated != nullptr) *options.rows_updated = std::move(rows);
  return s;
}

absl::Status DurableCollection::WriteThroughPush(const Table& t, absl::Span<const int64_t> ids,
                                                 absl::Span<const float> gradients, int64_t step,
                                                 const embedding::PushTag* tag) {
  absl::MutexLock order(t.write_mu.get());
  const std::string& name = t.config.name();
  // Summed and checked once: the rows it touches are snapshot, then it is applied as is.
  thread_local WrittenPart part;
  TESSERA_RETURN_IF_ERROR(SnapshotPart(t, ids, gradients, embedding::Gradients::kUnchecked, &part));
  absl::Status applied = memory_->PushSummed(name, part.summed, step);
  if (!applied.ok()) {
    UndoPart(part);
    if (tessera::IsPartlyApplied(applied)) {  // undone: not partly applied any more
      return absl::Status(applied.code(),
                          absl::StrCat(applied.message(),
                                       " [write-through table: the whole push was undone, "
                                       "no row changed]"));
    }
    return applied;
  }
  std::vector<KvWrite> writes;
  AppendPartWrites(part, tag, &writes);
  absl::Status s = store_->Write(writes, /*sync=*/true);
  if (s.ok()) {
    if (tag != nullptr) {
      HoldRecords(
          {{*tag, Record{static_cast<int64_t>(part.summed.size()), tag->map_version, name}}});
    }
    return absl::OkStatus();
  }
  UndoPart(part);
  return absl::Status(s.code(), absl::StrCat("table '", name,
                                             "': write-through push not applied, the disk "
                                             "refused it: ",
                                             s.message()));
}

}  // namespace tessera::storage
