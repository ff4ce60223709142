#include "embedding/internal/inprocess_collection.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <random>

#include "absl/cleanup/cleanup.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/check.h"
#include "base/status.h"
#include "embedding/batch_ops.h"
#include "embedding/sharding.h"
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
};

// Below this many ids a batch, its tables' work takes less time than waking threads for
// it: it stays on the calling thread.
constexpr size_t kParallelIds = 2048;

// The ids of every part of a batch (TableBags or TableGradients).
template <typename Part>
size_t TotalIds(absl::Span<const Part> parts) {
  size_t ids = 0;
  for (const Part& part : parts) ids += part.ids.size();
  return ids;
}

RequestScratch& Scratch() {
  thread_local RequestScratch s;
  return s;
}

// Groups the positions of `ids` by shard (a counting sort, stable within a shard).
void Route(absl::Span<const int64_t> ids, const v1::TableConfig& config, int num_shards,
           int outer, RequestScratch& s) {
  const size_t n = ids.size();
  s.shard_of.resize(n);
  s.shard_begin.assign(num_shards + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    s.shard_of[i] = embedding::ShardOfRow(config, ids[i], num_shards, outer);
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
  // Made under the lock: a SwitchPlace meanwhile would leave it laid out for the old place.
  absl::MutexLock lock(&mu_);
  if (tables_.count(config.name()) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("table '", config.name(), "' already exists"));
  }
  TESSERA_ASSIGN_OR_RETURN(TablePtr t, MakeTable(config, cluster_index_, cluster_shards_));
  tables_.emplace(config.name(), std::move(t));
  return absl::OkStatus();
}

absl::StatusOr<InProcessCollectionImpl::TablePtr> InProcessCollectionImpl::MakeTable(
    const v1::TableConfig& config, int index, int count) const {
  auto t = std::make_shared<ShardedTable>();
  t->config = config;
  t->outer = count;
  int64_t budget = 0;
  if (config.max_rows() > 0) budget = (config.max_rows() + num_shards_ - 1) / num_shards_;
  for (int k = 0; k < num_shards_; ++k) {
    // A fixed vocabulary's ids of this shard: those of the cluster shard, every
    // num_shards-th of them.
    const embedding::VocabularyPart part{index + int64_t{count} * k, int64_t{count} * num_shards_};
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingTable> shard,
                             EmbeddingTable::Create(config, budget, part));
    t->shards.push_back(std::move(shard));
  }
  TESSERA_RETURN_IF_ERROR(CheckReservedMemory(*t));
  for (auto& shard : t->shards) shard->set_memory_budget(memory_.get());
  return t;
}

absl::Status InProcessCollectionImpl::CheckReservedMemory(const ShardedTable& t) const {
  int64_t bytes = 0;
  for (const auto& shard : t.shards) bytes += shard->ReservedBytes();
  if (bytes == 0 || memory_ == nullptr || memory_->HasRoomFor(bytes)) return absl::OkStatus();
  std::vector<std::string> what;
  if (t.config.vocabulary_size() > 0) {
    what.push_back(absl::StrCat("the arrays of a vocabulary of ", t.config.vocabulary_size(),
                                " rows"));
  }
  if (t.config.admission().min_count() > 1) {
    what.push_back("its admission sketch (admission.sketch_width)");
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "table '", t.config.name(), "': ", absl::StrJoin(what, " and "), " take ",
      embedding::Mebibytes(bytes), " here, and the memory budget has ",
      embedding::Mebibytes(std::max<int64_t>(0, memory_->limit() - memory_->used())),
      " left of ", embedding::Mebibytes(memory_->limit()),
      "; add shards, shrink the vocabulary or the sketch, or raise the memory limit"));
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
  moving_.erase(std::string(table));
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
  // Only some ids: each shard reads its own.
  std::vector<std::vector<int64_t>> ids_of(options.ids.empty() ? 0 : t->shards.size());
  for (const int64_t id : options.ids) {
    ids_of[embedding::ShardOfRow(t->config, id, num_shards_, t->outer)].push_back(id);
  }
  for (size_t k = 0; k < t->shards.size(); ++k) {
    // Copied out under the table's locks, handed to the sink outside them.
    std::vector<embedding::RowBlock> full;
    auto add = [&](int64_t id, const float* w, const float* st, const embedding::RowMeta& m) {
      if (options.since_step >= 0 && m.last_step < options.since_step) return;
      block.Append(id, w, st, m.last_step, m.update_count);
      if (block.size() >= chunk) {
        full.push_back(block);
        block.Clear();
      }
    };
    if (options.ids.empty()) {
      t->shards[k]->ForEachRow(add);
    } else {
      t->shards[k]->ReadRows(ids_of[k], add);
    }
    for (const auto& b : full) TESSERA_RETURN_IF_ERROR(sink(b));
  }
  if (block.size() > 0) TESSERA_RETURN_IF_ERROR(sink(block));
  return absl::OkStatus();
}

absl::Status InProcessCollectionImpl::SetRowBudget(absl::string_view table, int64_t max_rows) {
  TablePtr t;
  {
    // Exclusive, as AlterTable: ListTables copies configs under the shared lock.
    absl::MutexLock lock(&mu_);
    auto it = tables_.find(table);
    if (it == tables_.end()) {
      return absl::NotFoundError(absl::StrCat("table '", table, "' not found"));
    }
    t = it->second;
    if (t->config.vocabulary_size() > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("table '", table, "' has a fixed vocabulary: no row budget"));
    }
    t->config.set_max_rows(std::max<int64_t>(0, max_rows));
  }
  // Split over its shards as CreateTable splits it.
  const int64_t each = max_rows > 0 ? (max_rows + num_shards_ - 1) / num_shards_ : 0;
  for (const auto& shard : t->shards) TESSERA_RETURN_IF_ERROR(shard->SetRowBudget(each));
  return absl::OkStatus();
}

absl::Status InProcessCollectionImpl::Repartition(int shard_index, int num_shards) {
  TESSERA_RETURN_IF_ERROR(SwitchPlace(shard_index, num_shards));
  ForgetStrays();
  return absl::OkStatus();
}

void InProcessCollectionImpl::ForgetStrays() {
  // Nothing to forget unless a switch left rows of the old place or a reshard brought
  // rows of another.
  if (!unsettled_.exchange(false)) return;
  const int shard_index = cluster_index_.load();
  const int num_shards = cluster_shards_.load();
  std::vector<TablePtr> tables;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [name, t] : tables_) {
      if (t->config.vocabulary_size() == 0) tables.push_back(t);  // fixed: switched whole
    }
  }
  for (const TablePtr& t : tables) {
    for (const auto& shard : t->shards) {
      std::vector<int64_t> leaving;
      shard->ForEachRow([&](int64_t id, const float*, const float*, const embedding::RowMeta&) {
        if (embedding::ShardOfRow(t->config, id, num_shards) != shard_index) leaving.push_back(id);
      });
      for (const int64_t id : leaving) shard->Forget(id);
    }
  }
}

absl::Status InProcessCollectionImpl::SwitchPlace(int shard_index, int num_shards) {
  TESSERA_RETURN_IF_ERROR(CheckPlace(shard_index, num_shards));
  std::vector<TablePtr> dropped;  // freed after the lock
  absl::MutexLock lock(&mu_);
  if (shard_index == cluster_index_.load() && num_shards == cluster_shards_.load()) {
    return absl::OkStatus();
  }
  const bool moved_here = moving_index_ == shard_index && moving_count_ == num_shards;
  // Every layout made before any is swapped: nothing changes on an error.
  std::vector<std::pair<std::string, TablePtr>> next;
  for (const auto& [name, t] : tables_) {
    if (t->config.vocabulary_size() == 0) continue;
    auto it = moving_.find(name);
    TablePtr n;
    if (moved_here && it != moving_.end()) {
      n = it->second;
    } else {
      TESSERA_ASSIGN_OR_RETURN(n, MakeTable(t->config, shard_index, num_shards));
    }
    // An AlterTable since the rows came changed the serving table's optimizer only.
    if (n->config.optimizer().SerializeAsString() != t->config.optimizer().SerializeAsString()) {
      for (const auto& shard : n->shards) {
        TESSERA_RETURN_IF_ERROR(shard->SetOptimizer(t->config.optimizer()));
      }
    }
    n->config = t->config;
    next.emplace_back(name, std::move(n));
  }
  for (auto& [name, n] : next) {
    dropped.push_back(std::exchange(tables_[name], std::move(n)));
  }
  for (auto& [name, t] : moving_) dropped.push_back(std::move(t));
  moving_.clear();
  moving_index_ = -1;
  moving_count_ = 0;
  cluster_index_.store(shard_index);
  cluster_shards_.store(num_shards);
  unsettled_.store(true);
  return absl::OkStatus();
}

absl::Status InProcessCollectionImpl::CheckPlace(int shard_index, int num_shards) {
  if (num_shards < 1 || shard_index < 0 || shard_index >= num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", shard_index, " of ", num_shards, " is not a place in a shard map"));
  }
  return absl::OkStatus();
}

absl::Status InProcessCollectionImpl::ImportMovingRows(absl::string_view table,
                                                       const embedding::RowBlock& rows,
                                                       int shard_index, int num_shards) {
  TESSERA_RETURN_IF_ERROR(CheckPlace(shard_index, num_shards));
  TESSERA_ASSIGN_OR_RETURN(TablePtr t, Find(table));
  if (t->config.vocabulary_size() == 0) {
    // Rows of ids the current place does not own are strays until the commit: an abort
    // forgets them (DropMovingRows).
    if (!embedding::OwnsAll(t->config, rows.ids, cluster_index_.load(), cluster_shards_.load())) {
      unsettled_.store(true);
    }
    return ImportInto(*t, rows);
  }
  TablePtr next;
  {
    absl::MutexLock lock(&mu_);
    if (moving_index_ != shard_index || moving_count_ != num_shards) {
      moving_.clear();  // another place's (a reshard given up)
      moving_index_ = shard_index;
      moving_count_ = num_shards;
    }
    TablePtr& slot = moving_[std::string(table)];
    if (slot == nullptr) {
      absl::StatusOr<TablePtr> made = MakeTable(t->config, shard_index, num_shards);
      if (!made.ok()) {
        moving_.erase(std::string(table));
        return made.status();
      }
      slot = *std::move(made);
    }
    next = slot;
  }
  return ImportInto(*next, rows);
}

absl::Status InProcessCollectionImpl::DropMovingRows() {
  std::map<std::string, TablePtr, std::less<>> dropped;  // freed after the lock
  {
    absl::MutexLock lock(&mu_);
    dropped.swap(moving_);
    moving_index_ = -1;
    moving_count_ = 0;
  }
  ForgetStrays();
  return absl::OkStatus();
}

absl::Status InProcessCollectionImpl::ImportRows(absl::string_view table,
                                                 const embedding::RowBlock& rows) {
  TESSERA_ASSIGN_OR_RETURN(TablePtr t, Find(table));
  return ImportInto(*t, rows);
}

absl::Status InProcessCollectionImpl::ImportInto(const ShardedTable& t,
                                                 const embedding::RowBlock& rows) {
  TESSERA_RETURN_IF_ERROR(embedding::CheckRowBlock(t.config.name(), t.config.dim(),
                                                   t.shards[0]->optimizer().StateFloats(), rows));
  const int dim = rows.dim;
  const int sf = t.shards[0]->optimizer().StateFloats();
  // A shard whose budget cannot take the new rows refuses the whole import first.
  std::vector<std::vector<int64_t>> per_shard(num_shards_);
  for (const int64_t id : rows.ids) {
    per_shard[embedding::ShardOfRow(t.config, id, num_shards_, t.outer)].push_back(id);
  }
  std::vector<int32_t> inverse;
  std::vector<int64_t> distinct;
  for (int k = 0; k < num_shards_; ++k) {
    embedding::Unique(per_shard[k], &distinct, &inverse);
    TESSERA_RETURN_IF_ERROR(t.shards[k]->CheckRoomFor(distinct));
  }
  std::vector<float> initial(sf);
  t.shards[0]->optimizer().InitState(initial.data());
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t id = rows.ids[i];
    embedding::RowMeta meta;
    if (!rows.last_steps.empty()) meta.last_step = rows.last_steps[i];
    if (!rows.update_counts.empty()) meta.update_count = rows.update_counts[i];
    const absl::Span<const float> state = rows.state.empty()
                                              ? absl::MakeConstSpan(initial)
                                              : absl::MakeConstSpan(rows.state).subspan(i * sf, sf);
    TESSERA_RETURN_IF_ERROR(
        t.shards[embedding::ShardOfRow(t.config, id, num_shards_, t.outer)]->PutRow(
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

const std::vector<std::unique_ptr<EmbeddingTable>>* InProcessCollectionImpl::MovingShardsOf(
    absl::string_view table) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = moving_.find(table);
  return it != moving_.end() ? &it->second->shards : nullptr;
}

absl::StatusOr<embedding::TableUsage> InProcessCollectionImpl::Usage(
    absl::string_view table) const {
  TESSERA_ASSIGN_OR_RETURN(TablePtr t, Find(table));
  embedding::TableUsage usage;
  for (const auto& shard : t->shards) {
    usage.rows += shard->num_rows();
    usage.memory_bytes += shard->MemoryBytes();
    usage.evictions += shard->evictions();
    usage.expirations += shard->expirations();
    usage.admission_refused += shard->refused_ids();
  }
  if (memory_ != nullptr) {
    usage.budget_bytes = memory_->limit();
    usage.budget_used_bytes = memory_->used();
  }
  return usage;
}

void InProcessCollectionImpl::PlanIds(const ShardedTable& t, absl::Span<const int64_t> ids,
                                      embedding::IdPlan* plan) const {
  plan->seed = t.config.seed();
  plan->num_shards = num_shards_;
  if (num_shards_ == 1) {
    embedding::Unique(ids, &plan->unique_ids, &plan->inverse);
    plan->shard_begin = {0, static_cast<int32_t>(plan->unique_ids.size())};
    return;
  }
  RequestScratch& s = Scratch();
  embedding::Unique(ids, &s.unique_ids, &s.inverse);
  Route(s.unique_ids, t.config, num_shards_, t.outer, s);
  plan->unique_ids.assign(s.routed_ids.begin(), s.routed_ids.end());
  plan->shard_begin.assign(s.shard_begin.begin(), s.shard_begin.end());
  // routed_pos[r] is the first-seen position of the r-th routed id: invert it, then map
  // each id's first-seen position to its routed one.
  s.cursor.resize(s.unique_ids.size());
  for (size_t r = 0; r < s.routed_pos.size(); ++r) {
    s.cursor[s.routed_pos[r]] = static_cast<int32_t>(r);
  }
  plan->inverse.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) plan->inverse[i] = s.cursor[s.inverse[i]];
}

absl::Status InProcessCollectionImpl::GatherPlanned(ShardedTable& t, const embedding::IdPlan& plan,
                                                    float* rows, bool insert_missing) {
  const int dim = t.config.dim();
  for (int k = 0; k < num_shards_; ++k) {
    const int32_t begin = plan.shard_begin[k];
    const int32_t count = plan.shard_begin[k + 1] - begin;
    if (count == 0) continue;
    TESSERA_RETURN_IF_ERROR(
        t.shards[k]->Lookup(absl::MakeConstSpan(plan.unique_ids).subspan(begin, count),
                            rows + static_cast<size_t>(begin) * dim, insert_missing));
  }
  return absl::OkStatus();
}

absl::Status InProcessCollectionImpl::Lookup(absl::string_view table, absl::Span<const int64_t> ids,
                                             absl::Span<float> out,
                                             const embedding::LookupOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(TablePtr t, Find(table));
  TESSERA_RETURN_IF_ERROR(
      embedding::CheckRowsSize(table, "output", out.size(), ids.size(), t->config.dim(), "ids"));
  return LookupChecked(*t, {std::string(table), ids, {}, {}, v1::SUM, out}, options);
}

absl::Status InProcessCollectionImpl::PooledLookup(absl::string_view table,
                                                   absl::Span<const int64_t> ids,
                                                   absl::Span<const int32_t> offsets,
                                                   absl::Span<const float> weights,
                                                   v1::Pooling pooling, absl::Span<float> out,
                                                   const embedding::LookupOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(TablePtr t, Find(table));
  TESSERA_RETURN_IF_ERROR(Annotate(embedding::ValidateBags(ids.size(), offsets, weights.size()),
                                   absl::StrCat("table '", table, "'")));
  const size_t bags = offsets.size() - 1;
  TESSERA_RETURN_IF_ERROR(
      embedding::CheckRowsSize(table, "output", out.size(), bags, t->config.dim(), "bags"));
  TESSERA_RETURN_IF_ERROR(
      embedding::CheckFiniteWeights(absl::StrCat("table '", table, "'"), weights));
  return LookupChecked(*t, {std::string(table), ids, offsets, weights, pooling, out}, options);
}

absl::Status InProcessCollectionImpl::LookupBatch(absl::Span<const embedding::TableBags> tables,
                                                  const embedding::LookupOptions& options) {
  // Every part found and its shape checked (the first bad one reported) before any is read.
  // (A thread_local named inside the lambda would be the pool thread's own: take a reference.)
  thread_local std::vector<TablePtr> this_threads_found;
  std::vector<TablePtr>& found = this_threads_found;
  found.clear();
  // A dropped table is freed when this call ends, not by this thread's next call.
  absl::Cleanup release = [&found] { found.clear(); };
  for (const embedding::TableBags& part : tables) {
    TESSERA_ASSIGN_OR_RETURN(TablePtr t, Find(part.table));
    TESSERA_ASSIGN_OR_RETURN(const size_t rows, embedding::CheckLookupShape(
                                                    absl::StrCat("table '", part.table, "'"),
                                                    part.ids.size(), part.offsets, part.weights));
    TESSERA_RETURN_IF_ERROR(embedding::CheckRowsSize(part.table, "output", part.out.size(), rows,
                                                     t->config.dim(),
                                                     part.offsets.empty() ? "ids" : "bags"));
    found.push_back(std::move(t));
  }
  return pool_->For(TotalIds(tables), kParallelIds)
      .ParallelForStatus(static_cast<int>(tables.size()),
                         [&](int i) { return LookupChecked(*found[i], tables[i], options); });
}

absl::Status InProcessCollectionImpl::LookupChecked(ShardedTable& t,
                                                    const embedding::TableBags& part,
                                                    const embedding::LookupOptions& options) {
  const int dim = t.config.dim();
  const bool pooled = !part.offsets.empty();
  if (part.plan != nullptr) part.plan->valid = false;
  // One shard needs no routing, and the table reads repeated ids correctly itself.
  if (!pooled && num_shards_ == 1 && part.plan == nullptr) {
    return t.shards[0]->Lookup(part.ids, part.out.data(), options.insert_missing);
  }
  // The distinct ids grouped by shard: each shard gathers its range of the rows in place.
  thread_local embedding::IdPlan this_threads_plan;
  embedding::IdPlan& plan = part.plan != nullptr ? *part.plan : this_threads_plan;
  PlanIds(t, part.ids, &plan);
  RequestScratch& s = Scratch();
  s.rows.resize(plan.unique_ids.size() * dim);
  TESSERA_RETURN_IF_ERROR(GatherPlanned(t, plan, s.rows.data(), options.insert_missing));
  if (pooled) {
    embedding::PoolBags(s.rows.data(), dim, plan.inverse, part.offsets, part.weights, part.pooling,
                        part.out.data());
  } else {
    for (size_t i = 0; i < part.ids.size(); ++i) {
      std::copy_n(s.rows.data() + static_cast<size_t>(plan.inverse[i]) * dim, dim,
                  part.out.data() + i * dim);
    }
  }
  if (part.plan != nullptr) plan.fingerprint = embedding::IdsFingerprint(plan.unique_ids);
  plan.valid = true;
  return absl::OkStatus();
}

absl::Status InProcessCollectionImpl::PushGradients(absl::string_view table,
                                                    absl::Span<const int64_t> ids,
                                                    absl::Span<const float> gradients,
                                                    int64_t step) {
  const embedding::TableGradients part{std::string(table), ids, gradients};
  return PushBatch({&part, 1}, step, {});
}

absl::Status InProcessCollectionImpl::PushBatch(absl::Span<const embedding::TableGradients> tables,
                                                int64_t step,
                                                const embedding::PushOptions& options) {
  TESSERA_RETURN_IF_ERROR(embedding::RefuseSync(options));
  // Every part is found, deduplicated, summed, checked and routed, and every shard's room
  // for its new rows checked, before any row changes: a bad part refuses the whole batch.
  thread_local std::vector<PushPart> this_threads_parts;
  std::vector<PushPart>& parts = this_threads_parts;  // the pool's threads fill it too
  absl::Cleanup release = [&parts] {
    for (PushPart& p : parts) p.table.reset();
  };
  if (parts.size() < tables.size()) parts.resize(tables.size());
  for (size_t i = 0; i < tables.size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(parts[i].table, Find(tables[i].table));
  }
  const int n = static_cast<int>(tables.size());
  // Parts checked where the push entered this process are not scanned again.
  TESSERA_DCHECK(options.checked == nullptr || options.checked->parts().data() == tables.data());
  const embedding::Gradients given = options.checked != nullptr ? embedding::Gradients::kChecked
                                                                : embedding::Gradients::kUnchecked;
  base::ThreadPool& pool = pool_->For(TotalIds(tables), kParallelIds);
  absl::Status s = pool.ParallelForStatus(n, [&](int i) -> absl::Status {
    PushPart& p = parts[i];
    const embedding::TableGradients& part = tables[i];
    p.planned = PlannedHere(*p.table, part);
    if (p.planned) return CheckPlanned(*p.table, part, given);
    TESSERA_RETURN_IF_ERROR(embedding::SumGradients(part.table, part.ids, part.gradients,
                                                    p.table->config.dim(), &p.summed, given));
    return RouteSummed(*p.table, p.summed, &p.routed);
  });
  if (s.ok()) s = CheckBatchMemory(tables, absl::MakeConstSpan(parts.data(), tables.size()));
  if (options.check_only) return s;
  absl::InlinedVector<absl::Status, 32> applied(s.ok() ? n : 0);
  if (s.ok()) {
    pool.ParallelFor(n, [&](int i) {
      PushPart& p = parts[i];
      applied[i] = p.planned ? ApplyPlanned(*p.table, *tables[i].plan, tables[i].gradients, step)
                             : ApplyRouted(*p.table, p.summed, p.routed, step);
    });
  }
  TESSERA_RETURN_IF_ERROR(s);
  if (options.rows_updated != nullptr) {
    options.rows_updated->resize(tables.size());
    for (size_t i = 0; i < tables.size(); ++i) {
      (*options.rows_updated)[i] =
          static_cast<int64_t>(parts[i].planned ? tables[i].ids.size() : parts[i].summed.size());
    }
  }
  // Every part was checked: whatever failed now did so beside parts that applied (or after
  // some of its own shards did), so the batch is never to be applied again.
  absl::Status partly;  // the first part that kept some rows (non-finite results)
  for (absl::Status& a : applied) {
    if (partly.ok() && !a.ok()) partly = tessera::PartlyApplied(std::move(a));
  }
  return partly;
}

absl::Status InProcessCollectionImpl::PushSummed(absl::string_view table,
                                                 const embedding::SummedGradients& gradients,
                                                 int64_t step) {
  TESSERA_ASSIGN_OR_RETURN(TablePtr t, Find(table));
  TESSERA_DCHECK(gradients.dim() == t->config.dim());
  thread_local RoutedPush routed;
  TESSERA_RETURN_IF_ERROR(RouteSummed(*t, gradients, &routed));
  return ApplyRouted(*t, gradients, routed, step);
}

absl::Status InProcessCollectionImpl::RouteSummed(const ShardedTable& t,
                                                  const embedding::SummedGradients& g,
                                                  RoutedPush* out) {
  const int dim = t.config.dim();
  if (num_shards_ == 1) {
    out->shard_begin = {0, static_cast<int32_t>(g.size())};
    return t.shards[0]->CheckRoomFor(g.ids());
  }
  RequestScratch& s = Scratch();
  Route(g.ids(), t.config, num_shards_, t.outer, s);
  out->shard_begin = s.shard_begin;
  out->ids = s.routed_ids;
  out->rows.resize(g.size() * dim);
  for (size_t i = 0; i < s.routed_pos.size(); ++i) {
    std::copy_n(g.rows() + static_cast<size_t>(s.routed_pos[i]) * dim, dim,
                out->rows.data() + i * dim);
  }
  return CheckRoomByShard(t, out->shard_begin, out->ids);
}

absl::Status InProcessCollectionImpl::CheckRoomByShard(const ShardedTable& t,
                                                       absl::Span<const int32_t> shard_begin,
                                                       absl::Span<const int64_t> ids) const {
  // Each shard's update is all or nothing; a shard whose budget cannot take its new rows
  // refuses the batch before any shard applies its part.
  for (int k = 0; k < num_shards_; ++k) {
    const int32_t begin = shard_begin[k];
    const int32_t count = shard_begin[k + 1] - begin;
    if (count == 0) continue;
    TESSERA_RETURN_IF_ERROR(t.shards[k]->CheckRoomFor(ids.subspan(begin, count)));
  }
  // The shards share one memory budget: their new rows must fit in it together.
  const int64_t row_bytes = t.shards[0]->row_bytes();
  if (memory_ == nullptr || memory_->HasRoomFor(static_cast<int64_t>(ids.size()) * row_bytes)) {
    return absl::OkStatus();
  }
  const int64_t missing = MissingByShard(t, shard_begin, ids);
  if (missing == 0 || memory_->HasRoomFor(missing * row_bytes)) return absl::OkStatus();
  return embedding::MemoryBudgetFull(t.config.name(), *memory_, missing, row_bytes);
}

int64_t InProcessCollectionImpl::MissingByShard(const ShardedTable& t,
                                                absl::Span<const int32_t> shard_begin,
                                                absl::Span<const int64_t> ids) const {
  int64_t missing = 0;
  for (int k = 0; k < num_shards_; ++k) {
    missing +=
        t.shards[k]->MissingRows(ids.subspan(shard_begin[k], shard_begin[k + 1] - shard_begin[k]));
  }
  return missing;
}

absl::Status InProcessCollectionImpl::CheckBatchMemory(
    absl::Span<const embedding::TableGradients> tables, absl::Span<const PushPart> parts) const {
  if (memory_ == nullptr) return absl::OkStatus();
  int64_t most = 0;  // every id new
  for (size_t i = 0; i < parts.size(); ++i) {
    most += static_cast<int64_t>(parts[i].planned ? tables[i].ids.size() : parts[i].summed.size()) *
            parts[i].table->shards[0]->row_bytes();
  }
  if (memory_->HasRoomFor(most)) return absl::OkStatus();
  int64_t need = 0, rows = 0;
  std::string first;  // the first table that would create rows
  for (size_t i = 0; i < parts.size(); ++i) {
    const PushPart& p = parts[i];
    const bool one = !p.planned && num_shards_ == 1;
    const std::vector<int32_t>& begin =
        p.planned ? tables[i].plan->shard_begin : p.routed.shard_begin;
    absl::Span<const int64_t> ids = p.planned ? absl::MakeConstSpan(tables[i].plan->unique_ids)
                                    : one     ? p.summed.ids()
                                              : absl::MakeConstSpan(p.routed.ids);
    const int64_t missing = MissingByShard(*p.table, begin, ids);
    need += missing * p.table->shards[0]->row_bytes();
    rows += missing;
    if (missing > 0 && first.empty()) first = p.table->config.name();
  }
  if (memory_->HasRoomFor(need)) return absl::OkStatus();
  return embedding::MemoryBudgetFull(first, *memory_, rows, need / std::max<int64_t>(1, rows));
}

bool InProcessCollectionImpl::PlannedHere(const ShardedTable& t,
                                          const embedding::TableGradients& part) const {
  const embedding::IdPlan* plan = part.plan;
  return plan != nullptr && plan->valid && plan->seed == t.config.seed() &&
         plan->num_shards == num_shards_ && part.ids.data() == plan->unique_ids.data() &&
         part.ids.size() == plan->unique_ids.size() &&
         plan->shard_begin.size() == static_cast<size_t>(num_shards_) + 1 &&
         embedding::IdsFingerprint(part.ids) == plan->fingerprint;
}

absl::Status InProcessCollectionImpl::CheckPlanned(const ShardedTable& t,
                                                   const embedding::TableGradients& part,
                                                   embedding::Gradients given) {
  // The plan's ids are distinct, so each row of gradients is its id's sum: check what
  // SumGradients would, without summing (and, as it would, nothing checked before).
  if (given == embedding::Gradients::kUnchecked) {
    TESSERA_RETURN_IF_ERROR(embedding::CheckPush({&t.config, 1}, {&part, 1}).status());
  }
  return CheckRoomByShard(t, part.plan->shard_begin, part.plan->unique_ids);
}

absl::Status InProcessCollectionImpl::ApplyPlanned(ShardedTable& t, const embedding::IdPlan& plan,
                                                   absl::Span<const float> gradients,
                                                   int64_t step) {
  return ApplyByShard(t, plan.shard_begin, plan.unique_ids, gradients.data(), step);
}

absl::Status InProcessCollectionImpl::ApplyRouted(ShardedTable& t,
                                                  const embedding::SummedGradients& g,
                                                  const RoutedPush& routed, int64_t step) {
  // One shard: the summed rows as they are (RouteSummed copied nothing).
  if (num_shards_ == 1) return ApplyByShard(t, routed.shard_begin, g.ids(), g.rows(), step);
  return ApplyByShard(t, routed.shard_begin, routed.ids, routed.rows.data(), step);
}

absl::Status InProcessCollectionImpl::ApplyByShard(ShardedTable& t,
                                                   absl::Span<const int32_t> shard_begin,
                                                   absl::Span<const int64_t> ids, const float* rows,
                                                   int64_t step) {
  const int dim = t.config.dim();
  absl::Status partly;  // a shard that kept some rows (non-finite results); the rest go on
  for (int k = 0; k < num_shards_; ++k) {
    const int32_t begin = shard_begin[k];
    const int32_t count = shard_begin[k + 1] - begin;
    if (count == 0) continue;
    TESSERA_RETURN_IF_ERROR(tessera::SetAsidePartlyApplied(
        t.shards[k]->ApplyCheckedGradients(ids.subspan(begin, count),
                                           rows + static_cast<size_t>(begin) * dim, step),
        &partly));
  }
  return partly;
}

}  // namespace tessera::embedding_internal

namespace tessera::embedding {

absl::StatusOr<std::unique_ptr<InProcessCollection>> NewInProcessCollection(
    const InProcessOptions& options) {
  if (options.num_shards < 1 || options.num_shards > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("in-process shard count must be in [1, 4096], got ", options.num_shards));
  }
  std::shared_ptr<base::ThreadPool> pool = options.pool;
  if (pool == nullptr) {
    absl::StatusOr<std::shared_ptr<base::ThreadPool>> made = base::NewThreadPool(options.threads);
    TESSERA_RETURN_IF_ERROR(Annotate(made.status(), "in-process collection"));
    pool = *std::move(made);
  }
  return std::unique_ptr<InProcessCollection>(new embedding_internal::InProcessCollectionImpl(
      options.num_shards, std::move(pool),
      options.memory_limit == 0 ? DefaultMemoryBudget() : options.memory_limit,
      options.cluster_shard_index, options.cluster_num_shards));
}

absl::StatusOr<std::unique_ptr<InProcessCollection>> NewInProcessCollection(int num_shards) {
  InProcessOptions options;
  options.num_shards = num_shards;
  return NewInProcessCollection(options);
}

}  // namespace tessera::embedding
