#include "embedding/device/device_collection.h"

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "embedding/batch_ops.h"
#include "embedding/device/device_table.h"
#include "embedding/table_config.h"

namespace tessera::embedding::device {
namespace {

class DeviceCollection final : public EmbeddingCollection {
 public:
  explicit DeviceCollection(int device) : device_(device) {}

  absl::Status CreateTable(const v1::TableConfig& config) override;
  absl::StatusOr<std::vector<v1::TableConfig>> ListTables() const override;
  absl::Status Lookup(absl::string_view table, absl::Span<const int64_t> ids, absl::Span<float> out,
                      const LookupOptions& options) override;
  absl::Status PooledLookup(absl::string_view table, absl::Span<const int64_t> ids,
                            absl::Span<const int32_t> offsets, absl::Span<const float> weights,
                            v1::Pooling pooling, absl::Span<float> out,
                            const LookupOptions& options) override;
  absl::Status PushGradients(absl::string_view table, absl::Span<const int64_t> ids,
                             absl::Span<const float> gradients, int64_t step) override;
  absl::StatusOr<TableUsage> Usage(absl::string_view table) const override;
  int num_shards() const override { return 1; }
  absl::Status ExportRows(absl::string_view table, const ExportOptions& options,
                          const std::function<absl::Status(const RowBlock&)>& sink) override;
  absl::Status ImportRows(absl::string_view table, const RowBlock& rows) override;
  absl::Status DropTable(absl::string_view table) override;

 private:
  absl::StatusOr<DeviceTable*> Find(absl::string_view table) const;

  const int device_;
  // The maps. A table's calls hold its own mutex (taken before mu_) throughout, so a
  // DropTable waits for them.
  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<DeviceTable>, std::less<>> tables_ ABSL_GUARDED_BY(mu_);
  // One call at a time per table (DeviceTable is not thread-safe).
  mutable std::map<std::string, std::unique_ptr<absl::Mutex>, std::less<>> table_mu_
      ABSL_GUARDED_BY(mu_);

  absl::Mutex& TableMutex(absl::string_view table) const;
};

absl::StatusOr<DeviceTable*> DeviceCollection::Find(absl::string_view table) const {
  absl::MutexLock lock(&mu_);
  auto it = tables_.find(table);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("table '", table, "' not found"));
  }
  return it->second.get();
}

absl::Mutex& DeviceCollection::TableMutex(absl::string_view table) const {
  absl::MutexLock lock(&mu_);
  auto it = table_mu_.find(table);
  if (it == table_mu_.end()) {
    it = table_mu_.emplace(std::string(table), std::make_unique<absl::Mutex>()).first;
  }
  return *it->second;
}

absl::Status DeviceCollection::CreateTable(const v1::TableConfig& config) {
  absl::MutexLock lock(&mu_);
  if (auto it = tables_.find(config.name()); it != tables_.end()) {
    const std::vector<std::string> diff = TableConfigDifferences(it->second->config(), config);
    if (diff.empty()) return absl::OkStatus();
    return absl::AlreadyExistsError(
        absl::StrCat("table '", config.name(),
                     "' already exists with another config: ", absl::StrJoin(diff, "; ")));
  }
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<DeviceTable> table,
                           DeviceTable::Create(config, device_));
  tables_.emplace(config.name(), std::move(table));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::TableConfig>> DeviceCollection::ListTables() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::TableConfig> out;
  for (const auto& [name, table] : tables_) out.push_back(table->config());
  return out;
}

absl::Status DeviceCollection::Lookup(absl::string_view table, absl::Span<const int64_t> ids,
                                      absl::Span<float> out, const LookupOptions& options) {
  absl::MutexLock lock(&TableMutex(table));
  TESSERA_ASSIGN_OR_RETURN(DeviceTable * t, Find(table));
  TESSERA_RETURN_IF_ERROR(
      CheckRowsSize(table, "output", out.size(), ids.size(), t->config().dim(), "ids"));
  return t->Lookup(ids, {}, {}, v1::SUM, out.data(), options.insert_missing);
}

absl::Status DeviceCollection::PooledLookup(absl::string_view table, absl::Span<const int64_t> ids,
                                            absl::Span<const int32_t> offsets,
                                            absl::Span<const float> weights, v1::Pooling pooling,
                                            absl::Span<float> out, const LookupOptions& options) {
  absl::MutexLock lock(&TableMutex(table));
  TESSERA_ASSIGN_OR_RETURN(DeviceTable * t, Find(table));
  TESSERA_ASSIGN_OR_RETURN(const size_t bags, CheckLookupShape(absl::StrCat("table '", table, "'"),
                                                               ids.size(), offsets, weights));
  TESSERA_RETURN_IF_ERROR(
      CheckRowsSize(table, "output", out.size(), bags, t->config().dim(), "bags"));
  return t->Lookup(ids, offsets, weights, pooling, out.data(), options.insert_missing);
}

absl::Status DeviceCollection::PushGradients(absl::string_view table, absl::Span<const int64_t> ids,
                                             absl::Span<const float> gradients, int64_t step) {
  absl::MutexLock lock(&TableMutex(table));
  TESSERA_ASSIGN_OR_RETURN(DeviceTable * t, Find(table));
  thread_local SummedGradients summed;
  TESSERA_RETURN_IF_ERROR(SumGradients(table, ids, gradients, t->config().dim(), &summed));
  return t->ApplyUniqueGradients(summed.ids(), summed.rows(), step);
}

absl::StatusOr<TableUsage> DeviceCollection::Usage(absl::string_view table) const {
  absl::MutexLock lock(&TableMutex(table));
  TESSERA_ASSIGN_OR_RETURN(DeviceTable * t, Find(table));
  TableUsage usage;
  usage.rows = t->num_rows();
  usage.memory_bytes = t->MemoryBytes();
  return usage;
}

absl::Status DeviceCollection::ExportRows(
    absl::string_view table, const ExportOptions& options,
    const std::function<absl::Status(const RowBlock&)>& sink) {
  absl::MutexLock lock(&TableMutex(table));
  TESSERA_ASSIGN_OR_RETURN(DeviceTable * t, Find(table));
  RowBlock block;
  auto reset = [&] {
    block = RowBlock();
    block.dim = t->config().dim();
  };
  reset();
  absl::Status failed;
  TESSERA_RETURN_IF_ERROR(
      t->ForEachRow([&](int64_t id, const float* w, const float* s, const RowMeta& meta) {
        if (!failed.ok() || meta.last_step < options.since_step) return;
        if (options.with_state && block.size() == 0) {
          block.state_floats = static_cast<int>(
              row_math::StateFloatsOf(KindOf(t->config().optimizer().type()), block.dim));
        }
        block.Append(id, w, options.with_state ? s : nullptr, meta.last_step, meta.update_count);
        if (block.size() >= options.chunk_rows) {
          failed = sink(block);
          reset();
        }
      }));
  TESSERA_RETURN_IF_ERROR(failed);
  return block.size() > 0 ? sink(block) : absl::OkStatus();
}

absl::Status DeviceCollection::ImportRows(absl::string_view table, const RowBlock& rows) {
  absl::MutexLock lock(&TableMutex(table));
  TESSERA_ASSIGN_OR_RETURN(DeviceTable * t, Find(table));
  const int sf = row_math::StateFloatsOf(KindOf(t->config().optimizer().type()), t->config().dim());
  TESSERA_RETURN_IF_ERROR(CheckRowBlock(table, t->config().dim(), sf, rows));
  std::vector<float> state = rows.state;
  if (state.empty()) {
    // Rows without state start it afresh, as a host table's import does.
    state.resize(rows.size() * sf);
    for (size_t i = 0; i < rows.size(); ++i) {
      row_math::InitStateRow(KindOf(t->config().optimizer().type()), t->config().dim(),
                             t->config().optimizer().initial_accumulator(), state.data() + i * sf);
    }
  }
  std::vector<RowMeta> metas(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    metas[i].last_step = rows.last_steps.empty() ? -1 : rows.last_steps[i];
    metas[i].update_count = rows.update_counts.empty() ? 0 : rows.update_counts[i];
  }
  return t->PutRows(rows.ids, rows.weights.data(), state.data(), metas);
}

absl::Status DeviceCollection::DropTable(absl::string_view table) {
  absl::MutexLock table_lock(&TableMutex(table));  // no call of the table is under way
  absl::MutexLock lock(&mu_);
  auto it = tables_.find(table);
  if (it == tables_.end())
    return absl::NotFoundError(absl::StrCat("table '", table, "' not found"));
  tables_.erase(it);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<EmbeddingCollection>> NewDeviceCollection(int device) {
  TESSERA_RETURN_IF_ERROR(DeviceTable::Usable(device));
  return std::unique_ptr<EmbeddingCollection>(new DeviceCollection(device));
}

}  // namespace tessera::embedding::device
