// DurableCollection's pushes: recorded request ids, and write-through tables' rows written
// to the store with every push.

#include <algorithm>

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
  if (!options.check_only) return EmbeddingCollection::PushBatch(tables, step, options);
  absl::ReaderMutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(Usable());
  return memory_->PushBatch(tables, step, options);
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
  return it->second;
}

absl::Status DurableCollection::LoadPushRecords() {
  std::vector<std::tuple<uint64_t, embedding::PushTag, int64_t>> found;  // order, tag, rows
  TESSERA_RETURN_IF_ERROR(
      Annotate(store_->Scan(PushRecordPrefix(),
                            [&](absl::string_view key, absl::string_view value) {
                              embedding::PushTag tag;
                              uint64_t order = 0;
                              int64_t rows = 0;
                              if (!ParsePushRecordKey(key, &tag) ||
                                  !DecodePushRecord(value, &order, &rows)) {
                                return absl::DataLossError("malformed push record in the store");
                              }
                              found.emplace_back(order, tag, rows);
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
    const auto& [order, tag, rows] = found[i];
    records_[KeyOf(tag)] = rows;
    record_order_.push_back(tag);
  }
  return absl::OkStatus();
}

absl::Status DurableCollection::WriteThroughPush(const Table& t, absl::Span<const int64_t> ids,
                                                 absl::Span<const float> gradients, int64_t step,
                                                 const embedding::PushTag* tag) {
  absl::MutexLock order(t.write_mu.get());
  const std::string& name = t.config.name();
  const auto& shards = *memory_->ShardsOf(name);
  const int n = options_.num_shards;
  // Summed and checked once: the rows it touches are snapshot, then it is applied as is.
  thread_local embedding::SummedGradients summed;
  TESSERA_RETURN_IF_ERROR(embedding::SumGradients(name, ids, gradients, t.config.dim(), &summed));
  const absl::Span<const int64_t> unique = summed.ids();
  // The rows as they are now, to undo the push if the disk refuses it.
  struct Before {
    bool existed = false;
    std::vector<float> weights, state;
    embedding::RowMeta meta;
  };
  std::map<int64_t, Before> before;
  for (const int64_t id : unique) before[id];
  for (const int64_t id : unique) {
    shards[embedding::ShardOfRow(t.config, id, n, options_.cluster_num_shards)]->ReadRows(
        {&id, 1}, [&](int64_t rid, const float* w, const float* s, const embedding::RowMeta& m) {
          Before& b = before[rid];
          const int dim = t.config.dim();
          const int sf = shards[0]->optimizer().StateFloats();
          b.existed = true;
          b.weights.assign(w, w + dim);
          b.state.assign(s, s + sf);
          b.meta = m;
        });
  }
  // Undoes the push in memory: rows that were not in memory are forgotten, so their next
  // read finds the stored value (or initial weights) again.
  auto undo = [&] {
    for (auto& [id, b] : before) {
      auto& shard = shards[embedding::ShardOfRow(t.config, id, n, options_.cluster_num_shards)];
      // A row that cannot be put back (out of memory) is forgotten instead: its next
      // read finds its stored value, which the refused write did not change.
      if (!b.existed || !shard->PutRow(id, b.weights, b.state, b.meta).ok()) shard->Forget(id);
    }
  };
  absl::Status applied = memory_->PushSummed(name, summed, step);
  if (!applied.ok()) {
    undo();
    if (tessera::IsPartlyApplied(applied)) {  // undone: not partly applied any more
      return absl::Status(applied.code(),
                          absl::StrCat(applied.message(),
                                       " [write-through table: the whole push was undone, "
                                       "no row changed]"));
    }
    return applied;
  }
  std::vector<KvWrite> writes;
  AppendRowWrites(t, shards, options_.cluster_num_shards, unique, &writes);
  if (tag != nullptr) {
    // The record goes in the same write as the rows: after a crash both are there or
    // neither is. The oldest records beyond the limit go with it (a failed write leaves
    // them in the store; the next open trims them).
    absl::MutexLock lock(&record_mu_);
    writes.push_back(
        KvWrite{PushRecordKey(*tag),
                EncodePushRecord(next_record_++, static_cast<int64_t>(unique.size()))});
    while (!record_order_.empty() && record_order_.size() + 1 > options_.push_records) {
      writes.push_back(KvWrite{PushRecordKey(record_order_.front()), "", /*erase=*/true});
      records_.erase(KeyOf(record_order_.front()));
      record_order_.pop_front();
    }
  }
  absl::Status s = store_->Write(writes, /*sync=*/true);
  if (s.ok()) {
    if (tag != nullptr) {
      absl::MutexLock lock(&record_mu_);
      records_[KeyOf(*tag)] = static_cast<int64_t>(unique.size());
      record_order_.push_back(*tag);
    }
    return absl::OkStatus();
  }
  undo();
  return absl::Status(s.code(), absl::StrCat("table '", name,
                                             "': write-through push not applied, the disk "
                                             "refused it: ",
                                             s.message()));
}

}  // namespace tessera::storage
