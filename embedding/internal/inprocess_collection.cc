#include "embedding/internal/inprocess_collection.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "embedding/batch_ops.h"
#include "embedding/sharding.h"
#include "base/status.h"
#include "embedding/table_config.h"

namespace tessera::embedding_internal {
namespace {

using embedding::EmbeddingTable;

// Buffers reused by every call on a thread, so the hot path allocates nothing once warm.
struct RequestScratch {
  std::vector<int64_t> unique_ids;
  std::vector<int32_t> inverse;
  std::vector<float> rows;        // (unique, dim)
  std::vector<int32_t> shard_of;  // (unique)
  std::vector<int32_t> shard_begin;
  std::vector<int32_t> cursor;
  std::vector<int64_t> routed_ids;  // unique ids grouped by shard
  std::vector<int32_t> routed_pos;  // their positions in unique_ids
  std::vector<float> routed_rows;   // (unique, dim) in routed order
};

RequestScratch& Scratch() {
  thread_local RequestScratch s;
  return s;
}

// Groups the positions of `ids` by shard (a counting sort, stable within a shard).
void Route(absl::Span<const int64_t> ids, uint64_t seed, int num_shards, RequestScratch& s) {
  const size_t n = ids.size();
  s.shard_of.resize(n);
  s.shard_begin.assign(num_shards + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    s.shard_of[i] = embedding::ShardOf(ids[i], seed, num_shards);
    ++s.shard_begin[s.shard_of[i] + 1];
  }
  for (int k = 0; k < num_shards; ++k) s.shard_begin[k + 1] += s.shard_begin[k];
  s.routed_ids.resize(n);
  s.routed_pos.resize(n);
  s.cursor.assign(s.shard_begin.begin(), s.shard_begin.end() - 1);
  for (size_t i = 0; i < n; ++i) {
    const int32_t at = s.cursor[s.shard_of[i]]++;
    s.routed_ids[at] = ids[i];
    s.routed_pos[at] = static_cast<int32_t>(i);
  }
}

}  // namespace

absl::Status InProcessCollectionImpl::CreateTable(const v1::TableConfig& config) {
  TESSERA_RETURN_IF_ERROR(embedding::ValidateTableConfig(config));
  auto t = std::make_shared<ShardedTable>();
  t->config = config;
  int64_t budget = 0;
  if (config.max_rows() > 0) budget = (config.max_rows() + num_shards_ - 1) / num_shards_;
  for (int k = 0; k < num_shards_; ++k) {
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingTable> shard,
                             EmbeddingTable::Create(config, budget));
    t->shards.push_back(std::move(shard));
  }
  absl::MutexLock lock(&mu_);
  if (tables_.count(config.name()) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("table '", config.name(), "' already exists"));
  }
  tables_.emplace(config.name(), std::move(t));
  return absl::OkStatus();
}

absl::StatusOr<v1::TableConfig> InProcessCollectionImpl::AlterTable(
    absl::string_view table, const v1::OptimizerConfig& changes) {
  // Exclusive: ListTables copies configs under the shared lock. Calls in flight read a
  // table's dim, seed and name, which do not change, and their optimizer atomically.
  absl::MutexLock lock(&mu_);
  auto it = tables_.find(table);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("table '", table, "' not found"));
  }
  ShardedTable& t = *it->second;
  TESSERA_ASSIGN_OR_RETURN(v1::TableConfig altered, embedding::AlterOptimizer(t.config, changes));
  for (auto& shard : t.shards) TESSERA_RETURN_IF_ERROR(shard->SetOptimizer(altered.optimizer()));
  *t.config.mutable_optimizer() = altered.optimizer();
  return t.config;
}

absl::StatusOr<std::vector<v1::TableConfig>> InProcessCollectionImpl::ListTables() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<v1::TableConfig> out;
  for (const auto& [name, t] : tables_) out.push_back(t->config);
  return out;
}

absl::StatusOr<InProcessCollectionImpl::TablePtr> InProcessCollectionImpl::Find(
    absl::string_view table) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = tables_.find(table);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("table '", table, "' not found"));
  }
  return it->second;
}

absl::Status InProcessCollectionImpl::DropTable(absl::string_view table) {
  TablePtr dropped;  // freed after the lock, once the calls that found it are done
  absl::MutexLock lock(&mu_);
  auto it = tables_.find(table);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("table '", table, "' not found"));
  }
  dropped = std::move(it->second);
  tables_.erase(it);
  return absl::OkStatus();
}

absl::Status InProcessCollectionImpl::ExportRows(
    absl::string_view table, const embedding::ExportOptions& options,
    const std::function<absl::Status(const embedding::RowBlock&)>& sink) {
  TESSERA_ASSIGN_OR_RETURN(TablePtr t, Find(table));
  const int dim = t->config.dim();
  const int sf = t->shards[0]->optimizer().StateFloats();
  embedding::RowBlock block;
  block.dim = dim;
  block.state_floats = options.with_state ? sf : 0;
  const size_t chunk = std::max<size_t>(1, options.chunk_rows);
  for (const auto& shard : t->shards) {
    // Copied out under the table's locks, handed to the sink outside them.
    std::vector<embedding::RowBlock> full;
    shard->ForEachRow([&](int64_t id, const float* w, const float* st,
                          const embedding::RowMeta& m) {
      if (options.since_step >= 0 && m.last_step < options.since_step) return;
      block.Append(id, w, st, m.last_step, m.update_count);
      if (block.size() >= chunk) {
        full.push_back(block);
        block.Clear();
      }
    });
    for (const auto& b : full) TESSERA_RETURN_IF_ERROR(sink(b));
  }
  if (block.size() > 0) TESSERA_RETURN_IF_ERROR(sink(block));
  return absl::OkStatus();
}

absl::Status InProcessCollectionImpl::ImportRows(absl::string_view table,
                                             const embedding::RowBlock& rows) {
  TESSERA_ASSIGN_OR_RETURN(TablePtr t, Find(table));
  TESSERA_RETURN_IF_ERROR(embedding::CheckRowBlock(t->config.name(), t->config.dim(),
                                                   t->shards[0]->optimizer().StateFloats(), rows));
  const int dim = rows.dim;
  const int sf = t->shards[0]->optimizer().StateFloats();
  // A shard whose budget cannot take the new rows refuses the whole import first.
  std::vector<std::vector<int64_t>> per_shard(num_shards_);
  for (const int64_t id : rows.ids) {
    per_shard[embedding::ShardOf(id, t->config.seed(), num_shards_)].push_back(id);
  }
  std::vector<int32_t> inverse;
  std::vector<int64_t> distinct;
  for (int k = 0; k < num_shards_; ++k) {
    embedding::Unique(per_shard[k], &distinct, &inverse);
    TESSERA_RETURN_IF_ERROR(t->shards[k]->CheckRoomFor(distinct));
  }
  std::vector<float> initial(sf);
  t->shards[0]->optimizer().InitState(initial.data());
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t id = rows.ids[i];
    embedding::RowMeta meta;
    if (!rows.last_steps.empty()) meta.last_step = rows.last_steps[i];
    if (!rows.update_counts.empty()) meta.update_count = rows.update_counts[i];
    const absl::Span<const float> state =
        rows.state.empty() ? absl::MakeConstSpan(initial)
                           : absl::MakeConstSpan(rows.state).subspan(i * sf, sf);
    TESSERA_RETURN_IF_ERROR(
        t->shards[embedding::ShardOf(id, t->config.seed(), num_shards_)]->PutRow(
            id, absl::MakeConstSpan(rows.weights).subspan(i * dim, dim), state, meta,
            /*mark_dirty=*/true));
  }
  return absl::OkStatus();
}

const std::vector<std::unique_ptr<EmbeddingTable>>* InProcessCollectionImpl::ShardsOf(
    absl::string_view table) const {
  // The caller (DurableCollection) holds its own lock across drops.
  absl::StatusOr<TablePtr> t = Find(table);
  return t.ok() ? &(*t)->shards : nullptr;
}

absl::StatusOr<embedding::TableUsage> InProcessCollectionImpl::Usage(absl::string_view table) const {
  TESSERA_ASSIGN_OR_RETURN(TablePtr t, Find(table));
  embedding::TableUsage usage;
  for (const auto& shard : t->shards) {
    usage.rows += shard->num_rows();
    usage.memory_bytes += shard->MemoryBytes();
    usage.evictions += shard->evictions();
    usage.expirations += shard->expirations();
  }
  return usage;
}

absl::Status InProcessCollectionImpl::GatherUnique(ShardedTable& t,
                                               absl::Span<const int64_t> unique_ids, float* rows,
                                               bool insert_missing) {
  if (num_shards_ == 1) return t.shards[0]->Lookup(unique_ids, rows, insert_missing);
  RequestScratch& s = Scratch();
  const int dim = t.config.dim();
  Route(unique_ids, t.config.seed(), num_shards_, s);
  s.routed_rows.resize(unique_ids.size() * dim);
  for (int k = 0; k < num_shards_; ++k) {
    const int32_t begin = s.shard_begin[k];
    const int32_t count = s.shard_begin[k + 1] - begin;
    if (count == 0) continue;
    TESSERA_RETURN_IF_ERROR(t.shards[k]->Lookup(
        absl::MakeConstSpan(s.routed_ids).subspan(begin, count),
        s.routed_rows.data() + static_cast<size_t>(begin) * dim, insert_missing));
  }
  for (size_t i = 0; i < unique_ids.size(); ++i) {
    std::copy_n(s.routed_rows.data() + i * dim, dim,
                rows + static_cast<size_t>(s.routed_pos[i]) * dim);
  }
  return absl::OkStatus();
}

absl::Status InProcessCollectionImpl::Lookup(absl::string_view table, absl::Span<const int64_t> ids,
                                         absl::Span<float> out,
                                         const embedding::LookupOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(TablePtr t, Find(table));
  const int dim = t->config.dim();
  TESSERA_RETURN_IF_ERROR(
      embedding::CheckRowsSize(table, "output", out.size(), ids.size(), dim, "ids"));
  // One shard needs no routing, and the table reads repeated ids correctly itself.
  if (num_shards_ == 1) return t->shards[0]->Lookup(ids, out.data(), options.insert_missing);
  RequestScratch& s = Scratch();
  embedding::Unique(ids, &s.unique_ids, &s.inverse);
  s.rows.resize(s.unique_ids.size() * dim);
  TESSERA_RETURN_IF_ERROR(GatherUnique(*t, s.unique_ids, s.rows.data(), options.insert_missing));
  for (size_t i = 0; i < ids.size(); ++i) {
    std::copy_n(s.rows.data() + static_cast<size_t>(s.inverse[i]) * dim, dim, out.data() + i * dim);
  }
  return absl::OkStatus();
}

absl::Status InProcessCollectionImpl::PooledLookup(absl::string_view table,
                                               absl::Span<const int64_t> ids,
                                               absl::Span<const int32_t> offsets,
                                               absl::Span<const float> weights, v1::Pooling pooling,
                                               absl::Span<float> out,
                                               const embedding::LookupOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(TablePtr t, Find(table));
  const int dim = t->config.dim();
  TESSERA_RETURN_IF_ERROR(Annotate(embedding::ValidateBags(ids.size(), offsets, weights.size()),
                                   absl::StrCat("table '", table, "'")));
  const size_t bags = offsets.size() - 1;
  TESSERA_RETURN_IF_ERROR(embedding::CheckRowsSize(table, "output", out.size(), bags, dim, "bags"));
  TESSERA_RETURN_IF_ERROR(embedding::CheckFiniteWeights(absl::StrCat("table '", table, "'"),
                                                        weights));
  RequestScratch& s = Scratch();
  embedding::Unique(ids, &s.unique_ids, &s.inverse);
  s.rows.resize(s.unique_ids.size() * dim);
  TESSERA_RETURN_IF_ERROR(GatherUnique(*t, s.unique_ids, s.rows.data(), options.insert_missing));
  embedding::PoolBags(s.rows.data(), dim, s.inverse, offsets, weights, pooling, out.data());
  return absl::OkStatus();
}

absl::StatusOr<InProcessCollectionImpl::TablePtr> InProcessCollectionImpl::CheckedPush(
    absl::string_view table, absl::Span<const int64_t> ids,
    absl::Span<const float> gradients) const {
  TESSERA_ASSIGN_OR_RETURN(TablePtr t, Find(table));
  const int dim = t->config.dim();
  TESSERA_RETURN_IF_ERROR(
      embedding::CheckRowsSize(table, "gradients", gradients.size(), ids.size(), dim, "ids"));
  // Reject the whole batch before any shard changes.
  TESSERA_RETURN_IF_ERROR(embedding::CheckFiniteGradients(table, ids, gradients.data(), dim));
  return t;
}

absl::Status InProcessCollectionImpl::PushGradients(absl::string_view table,
                                                absl::Span<const int64_t> ids,
                                                absl::Span<const float> gradients, int64_t step) {
  TESSERA_ASSIGN_OR_RETURN(TablePtr t, CheckedPush(table, ids, gradients));
  return ApplyPush(*t, ids, gradients, step);
}

absl::Status InProcessCollectionImpl::PushBatch(absl::Span<const embedding::TableGradients> tables,
                                            int64_t step, const embedding::PushOptions& options) {
  TESSERA_RETURN_IF_ERROR(embedding::RefuseSync(options));
  std::vector<TablePtr> found;
  found.reserve(tables.size());
  for (const auto& part : tables) {
    TESSERA_ASSIGN_OR_RETURN(TablePtr t, CheckedPush(part.table, part.ids, part.gradients));
    found.push_back(std::move(t));
  }
  absl::Status partly;  // the first part that kept some rows (non-finite results)
  for (size_t i = 0; i < tables.size(); ++i) {
    TESSERA_RETURN_IF_ERROR(tessera::SetAsidePartlyApplied(
        ApplyPush(*found[i], tables[i].ids, tables[i].gradients, step), &partly));
  }
  return partly;
}

absl::Status InProcessCollectionImpl::ApplyPush(ShardedTable& t, absl::Span<const int64_t> ids,
                                            absl::Span<const float> gradients, int64_t step) {
  const int dim = t.config.dim();
  RequestScratch& s = Scratch();
  embedding::Unique(ids, &s.unique_ids, &s.inverse);
  s.rows.assign(s.unique_ids.size() * dim, 0.0f);
  embedding::SumRowsByInverse(gradients.data(), dim, s.inverse, s.rows.data());
  // Finite gradients of a repeated id can sum to Inf: refused here, before any shard
  // applies its part (each shard would only refuse its own).
  TESSERA_RETURN_IF_ERROR(Annotate(
      embedding::CheckFiniteGradients(t.config.name(), s.unique_ids, s.rows.data(), dim),
      "summed over repeated ids"));
  if (num_shards_ == 1) {
    return t.shards[0]->ApplyUniqueGradients(s.unique_ids, s.rows.data(), step);
  }
  Route(s.unique_ids, t.config.seed(), num_shards_, s);
  s.routed_rows.resize(s.unique_ids.size() * dim);
  for (size_t i = 0; i < s.routed_pos.size(); ++i) {
    std::copy_n(s.rows.data() + static_cast<size_t>(s.routed_pos[i]) * dim, dim,
                s.routed_rows.data() + i * dim);
  }
  // Each shard's update is all or nothing; a shard whose budget cannot take its new rows
  // refuses the batch before any shard applies its part.
  for (int k = 0; k < num_shards_; ++k) {
    const int32_t begin = s.shard_begin[k];
    const int32_t count = s.shard_begin[k + 1] - begin;
    if (count == 0) continue;
    TESSERA_RETURN_IF_ERROR(
        t.shards[k]->CheckRoomFor(absl::MakeConstSpan(s.routed_ids).subspan(begin, count)));
  }
  absl::Status partly;  // a shard that kept some rows (non-finite results); the rest go on
  for (int k = 0; k < num_shards_; ++k) {
    const int32_t begin = s.shard_begin[k];
    const int32_t count = s.shard_begin[k + 1] - begin;
    if (count == 0) continue;
    TESSERA_RETURN_IF_ERROR(tessera::SetAsidePartlyApplied(
        t.shards[k]->ApplyUniqueGradients(absl::MakeConstSpan(s.routed_ids).subspan(begin, count),
                                          s.routed_rows.data() + static_cast<size_t>(begin) * dim,
                                          step),
        &partly));
  }
  return partly;
}

}  // namespace tessera::embedding_internal

namespace tessera::embedding {
namespace {

absl::Status NoStorage() {
  return absl::FailedPreconditionError(
      "this collection has no storage: checkpoints need a data directory (--data_dir)");
}

}  // namespace

uint64_t RandomNonZeroId() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32 | rd()) | 1;
}

absl::Status EmbeddingCollection::LookupBatch(absl::Span<const TableBags> tables,
                                              const LookupOptions& options) {
  for (const TableBags& t : tables) {
    TESSERA_RETURN_IF_ERROR(
        CheckLookupShape(absl::StrCat("table '", t.table, "'"), t.ids.size(), t.offsets, t.weights)
            .status());
    TESSERA_RETURN_IF_ERROR(
        t.offsets.empty()
            ? Lookup(t.table, t.ids, t.out, options)
            : PooledLookup(t.table, t.ids, t.offsets, t.weights, t.pooling, t.out, options));
  }
  return absl::OkStatus();
}

absl::Status RefuseSync(const PushOptions& options) {
  if (!options.sync.active()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "synchronous pushes of data-parallel workers need tables on a cluster (shards and a "
      "coordinator); these are in this process");
}

absl::Status EmbeddingCollection::PushBatch(absl::Span<const TableGradients> tables, int64_t step,
                                            const PushOptions& options) {
  TESSERA_RETURN_IF_ERROR(RefuseSync(options));
  if (tables.empty()) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(std::vector<v1::TableConfig> configs, ListTables());
  for (const TableGradients& t : tables) {
    auto it = std::find_if(configs.begin(), configs.end(),
                           [&](const v1::TableConfig& c) { return c.name() == t.table; });
    if (it == configs.end()) {
      return absl::NotFoundError(absl::StrCat("table '", t.table, "' not found"));
    }
    TESSERA_RETURN_IF_ERROR(CheckRowsSize(t.table, "gradients", t.gradients.size(), t.ids.size(),
                                          it->dim(), "ids"));
    TESSERA_RETURN_IF_ERROR(CheckFiniteGradients(t.table, t.ids, t.gradients.data(), it->dim()));
  }
  absl::Status partly;
  for (const TableGradients& t : tables) {
    TESSERA_RETURN_IF_ERROR(
        SetAsidePartlyApplied(PushGradients(t.table, t.ids, t.gradients, step), &partly));
  }
  return partly;
}

absl::Status EmbeddingCollection::PushGradientsRecorded(absl::string_view table,
                                                        absl::Span<const int64_t> ids,
                                                        absl::Span<const float> gradients,
                                                        int64_t step, const PushTag&) {
  return PushGradients(table, ids, gradients, step);
}

std::optional<int64_t> EmbeddingCollection::RecordedPush(const PushTag&) const {
  return std::nullopt;
}

absl::StatusOr<CheckpointInfo> EmbeddingCollection::Checkpoint(int64_t, const Attachments&,
                                                               const CheckpointOptions&) {
  return NoStorage();
}

absl::StatusOr<CheckpointInfo> EmbeddingCollection::Restore(int64_t, Attachments*,
                                                            const RestoreOptions&) {
  return NoStorage();
}

absl::Status EmbeddingCollection::ExportRows(absl::string_view table, const ExportOptions&,
                                             const std::function<absl::Status(const RowBlock&)>&) {
  return absl::UnimplementedError(absl::StrCat("table '", table, "': this collection cannot export rows"));
}

absl::Status EmbeddingCollection::ImportRows(absl::string_view table, const RowBlock&) {
  return absl::UnimplementedError(absl::StrCat("table '", table, "': this collection cannot import rows"));
}

absl::StatusOr<v1::TableConfig> EmbeddingCollection::AlterTable(absl::string_view table,
                                                                const v1::OptimizerConfig&) {
  return absl::UnimplementedError(
      absl::StrCat("table '", table, "': this collection cannot alter tables"));
}

absl::Status ValidateModelName(absl::string_view model) {
  if (model.empty() || model.size() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("model name must be 1-64 characters, got '", model, "'"));
  }
  for (const char c : model) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model name '", model, "': use letters, digits, '_' and '-' (its tables are '",
          model, ".<name>')"));
    }
  }
  return absl::OkStatus();
}

bool TableOfModel(absl::string_view table, absl::string_view model) {
  return model.empty() ||
         (table.size() > model.size() + 1 && table.substr(0, model.size()) == model &&
          table[model.size()] == '.');
}

std::string CheckpointName(absl::string_view model, int64_t step) {
  return model.empty() ? absl::StrCat("checkpoint ", step)
                       : absl::StrCat("checkpoint ", step, " of model '", model, "'");
}

absl::Status CheckRestorable(int64_t step, const Attachments& attachments,
                             const RestoreOptions& options) {
  const std::string which = CheckpointName(options.model, step);
  for (const std::string& name : options.required_attachments) {
    if (attachments.count(name) == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(which, " holds no '", name, "' attachment; nothing was restored"));
    }
  }
  for (const auto& [name, want] : options.expected_attachments) {
    auto it = attachments.find(name);
    if (it == attachments.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat(which, " holds no '", name, "' attachment; nothing was restored"));
    }
    if (it->second != want) {
      return absl::FailedPreconditionError(
          absl::StrCat(which, " has '", name, "' = '", it->second, "', this run wants '", want,
                       "'; nothing was restored"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CheckpointInfo>> EmbeddingCollection::ListCheckpoints() const {
  return NoStorage();
}

}  // namespace tessera::embedding

namespace tessera::embedding {

absl::StatusOr<std::unique_ptr<InProcessCollection>> NewInProcessCollection(int num_shards) {
  if (num_shards < 1 || num_shards > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("in-process shard count must be in [1, 4096], got ", num_shards));
  }
  return std::unique_ptr<InProcessCollection>(
      new embedding_internal::InProcessCollectionImpl(num_shards));
}

}  // namespace tessera::embedding
