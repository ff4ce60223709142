#include "embedding/embedding_table.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/check.h"
#include "base/status.h"
#include "embedding/batch_ops.h"
#include "embedding/dtype.h"
#include "embedding/internal/admission.h"
#include "embedding/internal/fixed_rows.h"
#include "embedding/internal/reader_epochs.h"
#include "embedding/internal/row_initializer.h"
#include "embedding/internal/row_ops.h"
#include "embedding/internal/row_store.h"
#include "embedding/internal/stripe.h"
#include "embedding/internal/stripe_plan.h"
#include "embedding/row_math.h"
#include "embedding/sharding.h"

namespace tessera::embedding {

using embedding_internal::CopyFloats;
using embedding_internal::IdMap;
using embedding_internal::kNoRow;
using embedding_internal::kStripeShift;
using embedding_internal::MapEntry;
using embedding_internal::MapHash;
using embedding_internal::MapId;
using embedding_internal::PackedMeta;
using embedding_internal::ReaderScope;
using embedding_internal::RowStore;
using embedding_internal::SpinPause;
using embedding_internal::StripePlan;
using embedding_internal::StripeWriter;

static_assert(EmbeddingTable::kNumStripes == embedding_internal::kNumStripes);

namespace {

// Ids probed (and their rows prefetched) before the first of them is used; for lookups
// also the unit read again when a writer got in the way. (A batch of 4,096 ids gives a
// stripe about 64: a chunk of 32 drained the pipeline twice as often, measured 2-3%
// slower on gathers from 1 GiB tables.)
constexpr int kChunk = 64;
// How far ahead of its use an id's map bucket is prefetched (FindGroup, WarmRows).
constexpr int kProbeAhead = 8;
// Optimistic reads of one chunk before a lookup takes the stripe's lock.
constexpr int kOptimisticTries = 8;

// A batch this small leaves a stripe's group fewer ids than the group's own probe pipeline
// (8 ahead) needs to overlap their memory loads: the table warms its rows across groups
// first (WarmRows). A shard's part of a batch is often this thin.
bool ThinGroups(size_t ids) {
  return ids < 8 * static_cast<size_t>(embedding_internal::kNumStripes);
}

absl::Status ValidateAdmission(const v1::AdmissionConfig& a, const std::string& label) {
  using embedding_internal::AdmissionFilter;
  if (a.min_count() < 0 || a.min_count() > AdmissionFilter::kMaxMinCount) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": admission.min_count must be in [0, ",
                     AdmissionFilter::kMaxMinCount, "], got ", a.min_count()));
  }
  if (!(a.probability() >= 0.0f && a.probability() <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": admission.probability must be in [0, 1] (0: every id), got ", a.probability()));
  }
  constexpr int64_t kMaxSketchWidth = int64_t{1} << 32;
  if (a.sketch_width() < 0 || a.sketch_width() > kMaxSketchWidth) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": admission.sketch_width must be in [0, ", kMaxSketchWidth,
                     "] (0: ", AdmissionFilter::kDefaultSketchWidth, "), got ", a.sketch_width()));
  }
  return absl::OkStatus();
}

absl::Status ValidateVocabulary(const v1::TableConfig& c, const std::string& label) {
  if (c.vocabulary_size() == 0) return absl::OkStatus();
  if (c.vocabulary_size() < 0 || c.vocabulary_size() > kMaxVocabularySize) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": vocabulary_size must be in [0, ",
                                                   kMaxVocabularySize, "] (0: any id), got ",
                                                   c.vocabulary_size()));
  }
  if (c.max_rows() != 0 || c.eviction().policy() != v1::EVICTION_NONE ||
      c.eviction().ttl_steps() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": a fixed-vocabulary table (vocabulary_size ", c.vocabulary_size(),
        ") holds a row for every id of its vocabulary; it takes no max_rows, eviction or "
        "ttl_steps"));
  }
  return absl::OkStatus();
}

}  // namespace

int32_t ShardOfRow(const v1::TableConfig& config, int64_t id, int32_t num_shards, int32_t outer) {
  if (config.vocabulary_size() == 0) return ShardOf(id, config.seed(), num_shards);
  return static_cast<int32_t>(static_cast<uint64_t>(id) / static_cast<uint64_t>(outer) %
                              static_cast<uint64_t>(num_shards));
}

bool OwnsAll(const v1::TableConfig& config, absl::Span<const int64_t> ids, int32_t shard_index,
             int32_t num_shards) {
  return std::all_of(ids.begin(), ids.end(),
                     [&](int64_t id) { return ShardOfRow(config, id, num_shards) == shard_index; });
}

absl::Status CheckVocabulary(const v1::TableConfig& config, absl::Span<const int64_t> ids) {
  const int64_t n = config.vocabulary_size();
  if (n == 0) return absl::OkStatus();
  for (const int64_t id : ids) {
    if (id < 0 || id >= n) {
      return absl::InvalidArgumentError(absl::StrCat("table '", config.name(), "': id ", id,
                                                     " is outside its vocabulary [0, ", n, ")"));
    }
  }
  return absl::OkStatus();
}

namespace {

// A table name: what a model's tables are named (MODEL.NAME), safe in paths and commands.
absl::Status ValidateTableName(absl::string_view name) {
  if (name.empty() || name.size() > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("table name must be 1-255 characters, got '", name, "'"));
  }
  const bool dots_apart = name.front() != '.' && name.back() != '.' &&
                          name.find("..") == absl::string_view::npos;
  const bool characters = std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
  if (!dots_apart || !characters) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table name '", name, "': use letters, digits, '_', '-' and '.' (MODEL.NAME), with no "
        "'.' first, last or twice in a row"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateTableConfig(const v1::TableConfig& config) {
  TESSERA_RETURN_IF_ERROR(ValidateTableName(config.name()));
  const std::string label = absl::StrCat("table '", config.name(), "'");
  if (config.dim() <= 0 || config.dim() > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": dim must be in [1, 65536], got ", config.dim()));
  }
  if (config.max_rows() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": max_rows must be >= 0, got ", config.max_rows()));
  }
  if (!v1::InitializerType_IsValid(config.initializer().type())) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": unknown initializer type ", config.initializer().type()));
  }
  if (config.initializer().has_scale() &&
      !(config.initializer().scale() >= 0.0f && std::isfinite(config.initializer().scale()))) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": initializer scale must be >= 0, got ",
                                                   config.initializer().scale()));
  }
  if (!v1::Dtype_IsValid(config.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": unknown dtype ", config.dtype()));
  }
  if (!v1::Placement_IsValid(config.placement())) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": unknown placement ", config.placement()));
  }
  if (!v1::EvictionPolicy_IsValid(config.eviction().policy())) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": unknown eviction policy ", config.eviction().policy()));
  }
  if (config.eviction().policy() != v1::EVICTION_NONE && config.max_rows() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": eviction needs a row budget (max_rows > 0)"));
  }
  if (config.eviction().ttl_steps() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": ttl_steps must be >= 0, got ", config.eviction().ttl_steps()));
  }
  TESSERA_RETURN_IF_ERROR(ValidateAdmission(config.admission(), label));
  TESSERA_RETURN_IF_ERROR(ValidateVocabulary(config, label));
  absl::StatusOr<OptimizerParams> params = ResolveOptimizer(config.optimizer());
  return Annotate(params.status(), label);
}

absl::Status RequireHostPlacement(const v1::TableConfig& config) {
  if (config.placement() == v1::HOST) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "table '", config.name(),
      "' has placement DEVICE: its rows live in a trainer's GPU memory (tessera-train "
      "--dense_backend=cuda keeps it there); in-process collections and shard servers hold "
      "HOST tables"));
}

absl::StatusOr<std::unique_ptr<EmbeddingTable>> EmbeddingTable::Create(
    const v1::TableConfig& config, int64_t row_budget, VocabularyPart part) {
  TESSERA_RETURN_IF_ERROR(ValidateTableConfig(config));
  TESSERA_RETURN_IF_ERROR(RequireHostPlacement(config));
  if (row_budget < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", config.name(), "': row budget must be >= 0, got ", row_budget));
  }
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                           Optimizer::Create(config.optimizer(), config.dim()));
  bool out_of_memory = false;
  std::unique_ptr<embedding_internal::AdmissionFilter> admission =
      embedding_internal::AdmissionFilter::Create(config, &out_of_memory);
  if (out_of_memory) {
    return absl::ResourceExhaustedError(
        absl::StrCat("table '", config.name(), "': out of memory allocating the admission sketch"));
  }
  auto table = std::unique_ptr<EmbeddingTable>(
      new EmbeddingTable(config, row_budget, std::move(optimizer)));
  table->admission_ = std::move(admission);
  if (!table->rows_->ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("table '", config.name(), "': cannot map the directory of its rows"));
  }
  if (config.vocabulary_size() > 0) {
    if (part.count < 1 || part.index < 0 || part.index >= part.count) {
      return absl::InvalidArgumentError(absl::StrCat("table '", config.name(), "': part ",
                                                     part.index, " of ", part.count));
    }
    const bool counts = config.optimizer().type() == v1::ADAM || config.dtype() != v1::FP32;
    table->fixed_ = embedding_internal::FixedRows::Create(
        config.vocabulary_size(), part.index, part.count, table->weight_floats_,
        table->state_floats_, counts);
    if (table->fixed_ == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "table '", config.name(), "': cannot map the arrays of a vocabulary of ",
          config.vocabulary_size(), " rows"));
    }
    table->row_bytes_ = 0;  // the arrays count against a memory budget as a whole
    table->row_budget_ = 0;
  }
  return table;
}

EmbeddingTable::EmbeddingTable(const v1::TableConfig& config, int64_t row_budget,
                               std::unique_ptr<Optimizer> optimizer)
    : config_(config),
      dim_(config.dim()),
      dtype_(config.dtype()),
      state_floats_(optimizer->StateFloats()),
      weight_floats_((config.dim() * DtypeBytes(config.dtype()) + 3) / 4),
      read_lines_((weight_floats_ * 4 + 63) / 64),
      row_budget_(row_budget),
      optimizer_(optimizer.get()),
      initializer_(std::make_unique<embedding_internal::RowInitializer>(config)),
      policy_(config.eviction().policy()),
      ttl_steps_(config.eviction().ttl_steps()),
      readers_(std::make_unique<embedding_internal::ReaderEpochs>()),
      rows_(std::make_unique<RowStore>(weight_floats_ * 4, state_floats_)),
      stripes_(new Stripe[kNumStripes]) {
  // What a row takes of a process's memory: weights, state and meta, its share of the
  // map at the lowest load the map runs at (15 bytes for narrow rows, 22 for wide ones)
  // and a byte for its dirty bit and the store's blocks.
  row_bytes_ = rows_->row_bytes() +
               static_cast<int64_t>(std::ceil(IdMap::MostBytesPerRow(rows_->row_bytes()))) + 1;
  for (int s = 0; s < kNumStripes; ++s) stripes_[s].Init(readers_.get(), rows_.get());
  absl::MutexLock lock(&optimizers_mu_);
  optimizers_.push_back(std::move(optimizer));
}

int64_t EmbeddingTable::StoredRowBytes(const v1::TableConfig& config) {
  const int64_t weight_bytes = (config.dim() * DtypeBytes(config.dtype()) + 3) / 4 * 4;
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
      Optimizer::Create(config.optimizer(), config.dim());
  const int64_t state_bytes = optimizer.ok() ? 4 * int64_t{(*optimizer)->StateFloats()} : 0;
  return weight_bytes + state_bytes + static_cast<int64_t>(sizeof(PackedMeta));
}

EmbeddingTable::~EmbeddingTable() {
  if (memory_ != nullptr) memory_->Add(-num_rows() * row_bytes_ - ReservedBytes());
}

void EmbeddingTable::set_memory_budget(MemoryBudget* budget) {
  memory_ = budget;
  if (memory_ != nullptr) memory_->Add(ReservedBytes());
}

absl::Status EmbeddingTable::SetOptimizer(const v1::OptimizerConfig& config) {
  if (config.type() != config_.optimizer().type()) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", name(), "': its optimizer is ",
                     v1::OptimizerType_Name(config_.optimizer().type()), ", not ",
                     v1::OptimizerType_Name(config.type())));
  }
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> next, Optimizer::Create(config, dim_));
  absl::MutexLock lock(&optimizers_mu_);
  optimizer_.store(next.get(), std::memory_order_release);
  optimizers_.push_back(std::move(next));
  return absl::OkStatus();
}

void EmbeddingTable::InitialWeights(int64_t id, float* out) const {
  initializer_->InitialWeights(id, out);
}

float* EmbeddingTable::WeightsOf(Row row) const { return rows_->Weights(row); }
float* EmbeddingTable::StateOf(Row row) const { return rows_->State(row); }

RowMeta EmbeddingTable::MetaOf(Row row) const {
  const PackedMeta& packed = *rows_->Meta(row);
  RowMeta meta;
  meta.update_count = packed.updates;
  if (packed.updates == 0 && packed.step == PackedMeta{}.step) return meta;  // never updated
  const int64_t latest = latest_step_.load(std::memory_order_relaxed);
  meta.last_step = latest - static_cast<int64_t>(
                                static_cast<uint32_t>(static_cast<uint32_t>(latest) - packed.step));
  return meta;
}

void EmbeddingTable::SetMeta(Row row, const RowMeta& meta) const {
  PackedMeta& packed = *rows_->Meta(row);
  packed.updates = static_cast<uint32_t>(
      std::clamp<int64_t>(meta.update_count, 0, std::numeric_limits<uint32_t>::max()));
  packed.step = static_cast<uint32_t>(meta.last_step);
}

void EmbeddingTable::NoteStep(int64_t step) {
  int64_t latest = latest_step_.load(std::memory_order_relaxed);
  while (step > latest && !latest_step_.compare_exchange_weak(latest, step)) {
  }
}

void EmbeddingTable::InitRow(int64_t id, Row row) const {
  float* weights = WeightsOf(row);
  if (dtype_ == v1::FP32) {
    InitialWeights(id, weights);
  } else {
    thread_local std::vector<float> w;
    w.resize(dim_);
    InitialWeights(id, w.data());
    StoreWeights(w.data(), weights);
  }
  optimizer().InitState(StateOf(row));
  *rows_->Meta(row) = PackedMeta{};
}

void EmbeddingTable::CopyWeightsOut(const float* stored, float* out) const {
  if (dtype_ == v1::FP32) {
    CopyFloats(out, stored, dim_);
  } else {
    DecodeWeights(dtype_, stored, dim_, out);
  }
}

const float* EmbeddingTable::WeightsView(const float* stored) const {
  if (dtype_ == v1::FP32) return stored;
  thread_local std::vector<float> w;
  w.resize(dim_);
  DecodeWeights(dtype_, stored, dim_, w.data());
  return w.data();
}

void EmbeddingTable::StoreWeights(const float* w, float* stored) const {
  EncodeWeights(dtype_, w, dim_, stored);
}

bool EmbeddingTable::UpdateRowLocked(Stripe& stripe, int64_t id, Row row, const float* grad,
                                     int64_t step, float* scratch) {
  float* widened = scratch;   // (dim) half-precision weights as floats
  float* g = scratch + dim_;  // (dim) the gradient, when the optimizer must change it
  stripe.BeginChange();
  PackedMeta& packed = *rows_->Meta(row);
  const uint32_t prior = packed.updates;
  float* weights = rows_->Weights(row);
  float* state = rows_->State(row);
  // A weight or accumulator that overflowed would be stored, served and checkpointed: the
  // row keeps its last finite values instead (UpdateFinite changes nothing then).
  if (dtype_ == v1::FP32) {
    if (!optimizer().UpdateFinite(weights, state, grad, g, prior)) return false;
  } else {
    DecodeWeights(dtype_, weights, dim_, widened);
    if (!optimizer().UpdateFinite(widened, state, grad, g, prior)) return false;
    const uint64_t seed = row_math::UpdateRoundingSeed(initializer_->key(), id, prior);
    EncodeWeightsStochastic(dtype_, widened, dim_, seed, weights);
  }
  if (prior != std::numeric_limits<uint32_t>::max()) packed.updates = prior + 1;
  packed.step = static_cast<uint32_t>(step);
  MarkDirtyLocked(stripe, row);
  return true;
}

absl::Status EmbeddingTable::NonFiniteUpdateError(int64_t refused, int64_t first_id) const {
  return PartlyApplied(absl::InvalidArgumentError(absl::StrCat(
      "table '", name(), "': the update of ", refused, " row(s) (id ", first_id,
      " first) would make weights or optimizer state non-finite, so they keep their values "
      "(the other rows of the push are updated); lower the learning rate or clip gradients "
      "(clip_norm, clip_value)")));
}

absl::Status EmbeddingTable::BudgetError() const {
  // A table's max_rows is split over its shards: more shards do not add rows to it.
  return absl::ResourceExhaustedError(
      absl::StrCat("table '", name(), "': row budget of ", row_budget(),
                   " rows is full (this shard's part of the table's max_rows); raise max_rows, "
                   "or give the table an eviction policy (tessera-train and tessera-cli "
                   "create: --eviction=lru)"));
}

absl::Status EmbeddingTable::OutOfMemoryError() const {
  return absl::ResourceExhaustedError(
      absl::StrCat("table '", name(), "': out of memory allocating rows"));
}

absl::Status EmbeddingTable::TakeRows(int64_t n) {
  const int64_t before = num_rows_.fetch_add(n, std::memory_order_relaxed);
  if (const int64_t budget = row_budget(); budget > 0 && before + n > budget) {
    num_rows_.fetch_sub(n, std::memory_order_relaxed);
    return BudgetError();
  }
  if (memory_ != nullptr && !memory_->TryTake(n * row_bytes_)) {
    num_rows_.fetch_sub(n, std::memory_order_relaxed);
    return MemoryBudgetError(n);
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::MemoryBudgetError(int64_t rows) const {
  return MemoryBudgetFull(name(), *memory_, rows, row_bytes_);
}

int64_t EmbeddingTable::MissingRows(absl::Span<const int64_t> ids) const {
  if (fixed_ != nullptr) return 0;  // every row has its place already
  int64_t missing = 0;
  for (const int64_t id : ids) {
    const uint64_t h = MapHash(id);
    const Stripe& stripe = stripes_[h >> kStripeShift];
    absl::ReaderMutexLock lock(&stripe.mu);
    if (stripe.Find(h) == kNoRow && (admission_ == nullptr || admission_->WouldAdmit(id, h))) {
      ++missing;
    }
  }
  return missing;
}

EmbeddingTable::Row EmbeddingTable::InsertLocked(Stripe& stripe, int64_t id, uint64_t hash) {
  const Row row = stripe.Insert(hash);
  if (row != kNoRow) InitRow(id, row);
  return row;
}

absl::StatusOr<EmbeddingTable::Row> EmbeddingTable::FindOrInsertLocked(Stripe& stripe, int64_t id,
                                                                       uint64_t hash) {
  if (const Row row = stripe.Find(hash); row != kNoRow) return row;
  TESSERA_RETURN_IF_ERROR(TakeRows(1));
  const Row row = InsertLocked(stripe, id, hash);
  if (row == kNoRow) {
    AdjustRows(-1);
    return OutOfMemoryError();
  }
  return row;
}

void EmbeddingTable::MarkDirtyLocked(Stripe& stripe, Row row) {
  (void)stripe;
  if (rows_->SetDirty(row)) dirty_rows_.fetch_add(1, std::memory_order_relaxed);
}

void EmbeddingTable::EraseLocked(Stripe& stripe, uint64_t hash) {
  const int64_t pos = stripe.current() ? stripe.current()->FindSlot(hash) : -1;
  if (pos < 0) return;
  if (rows_->ClearDirty(stripe.current()->Slot(pos).row)) {
    dirty_rows_.fetch_sub(1, std::memory_order_relaxed);
  }
  stripe.EraseSlot(static_cast<uint64_t>(pos));
  AdjustRows(-1);
}

namespace {

// Brings row `row` of `rows` towards the cache: its weights, and for a write its state
// and meta too.
void PrefetchRow(const RowStore& rows, uint32_t row, bool for_write) {
  embedding_internal::PrefetchBytes(rows.Weights(row), rows.weight_bytes(), for_write);
  if (for_write) {
    embedding_internal::PrefetchBytes(rows.State(row), rows.cold_bytes(), true);
    // Its dirty bit's word too: one row in 64 shares it, so nearly every update's test of
    // the bit would otherwise wait for memory.
    embedding_internal::PrefetchLine(rows.DirtyWordOf(row), true);
  }
}

// Finds the rows of group [b, e) of `plan` in `map` (under its stripe's lock, or validated
// by a lock-free reader afterwards) into plan.rows[b..e): the first map bucket of id j is
// prefetched while id j - 8 is looked up and its row prefetched (when `prefetch`), so the
// caller's pass over the rows that follows finds them on their way. An id its first
// bucket does not settle has its second bucket prefetched and is looked up after the
// others (a miss then overlaps the group's work instead of stalling it). A row number
// that is not the store's (read torn beside a writer) counts as none.
void FindGroup(const IdMap* map, const RowStore& rows, StripePlan& plan, int b, int e,
               bool prefetch, bool for_write) {
  constexpr int kMaxDeferred = 64;
  int deferred[kMaxDeferred];
  int num_deferred = 0;
  // Rows handed out later than this are counted as not found (the caller's locked path
  // finds them): every row number read stays below it unless read torn.
  const uint32_t handed_out = rows.HandedOut();
  auto found = [&](int k, uint32_t row) {
    if (row >= handed_out) row = kNoRow;
    plan.rows[k] = row;
    if (row != kNoRow && prefetch) PrefetchRow(rows, row, for_write);
  };
  for (int j = b; j < e + kProbeAhead; ++j) {
    if (j < e && map != nullptr) map->Prefetch(plan.hash[plan.order[j]]);
    const int k = j - kProbeAhead;
    if (k < b) continue;
    if (map == nullptr) {
      plan.rows[k] = kNoRow;
      continue;
    }
    const uint64_t h = plan.hash[plan.order[k]];
    uint32_t row;
    if (map->FindInFirst(h, &row)) {
      found(k, row);
    } else if (num_deferred < kMaxDeferred) {
      map->PrefetchSecond(h);
      deferred[num_deferred++] = k;
    } else {
      found(k, map->FindInSecond(h));
    }
  }
  for (int d = 0; d < num_deferred; ++d) {
    found(deferred[d], map->FindInSecond(plan.hash[plan.order[deferred[d]]]));
  }
}

// Calls fn(stripe, begin, end) for every stripe with ids in `plan`, in stripe order, with
// the ids' group [begin, end) of plan.order; stops at fn's first error and returns it.
template <typename Fn>
absl::Status ForEachGroup(const StripePlan& plan, Fn&& fn) {
  for (int s = 0; s < embedding_internal::kNumStripes; ++s) {
    if (plan.begin[s] == plan.begin[s + 1]) continue;
    TESSERA_RETURN_IF_ERROR(fn(s, plan.begin[s], plan.begin[s + 1]));
  }
  return absl::OkStatus();
}

}  // namespace

void EmbeddingTable::WarmRows(const StripePlan& plan, bool for_write) const {
  const int n = static_cast<int>(plan.order.size());
  for (int j = 0; j < n + kProbeAhead; ++j) {
    if (j < n) {
      const uint64_t h = plan.hash[plan.order[j]];
      if (const IdMap* map = stripes_[h >> kStripeShift].map()) map->Prefetch(h);
    }
    const int k = j - kProbeAhead;
    if (k < 0) continue;
    const uint64_t h = plan.hash[plan.order[k]];
    const IdMap* map = stripes_[h >> kStripeShift].map();
    const uint32_t row = map != nullptr ? map->Find(h) : kNoRow;
    if (row != kNoRow && rows_->Valid(row)) PrefetchRow(*rows_, row, for_write);
  }
}

void EmbeddingTable::PrefetchNextBuckets(const StripePlan& plan, int from) const {
  const int end = std::min(from + kProbeAhead, static_cast<int>(plan.order.size()));
  for (int j = from; j < end; ++j) {
    const uint64_t h = plan.hash[plan.order[j]];
    if (const IdMap* map = stripes_[h >> kStripeShift].map()) map->Prefetch(h);
  }
}

void EmbeddingTable::CopyGroup(const StripePlan& plan, int b, int e, float* out) const {
  const RowStore& rows = *rows_;
  for (int k = b; k < e; ++k) {
    if (plan.rows[k] == kNoRow) continue;
    float* dst = out + static_cast<size_t>(plan.order[k]) * dim_;
    if (dtype_ == v1::FP32) {
      CopyFloats(dst, rows.Weights(plan.rows[k]), dim_);
    } else {
      DecodeWeights(dtype_, rows.Weights(plan.rows[k]), dim_, dst);
    }
  }
}

absl::Status EmbeddingTable::Lookup(absl::Span<const int64_t> ids, float* out,
                                    bool insert_missing) {
  if (fixed_ != nullptr) return FixedLookup(ids, out);
  StripePlan& plan = embedding_internal::PlanByStripe(ids);
  {
    ReaderScope reading(*readers_);
    if (ThinGroups(ids.size())) WarmRows(plan, /*for_write=*/false);
    (void)ForEachGroup(plan, [&](int s, int b, int e) {
      const Stripe& stripe = stripes_[s];
      for (int c = b; c < e; c += kChunk) {
        const int ce = std::min(e, c + kChunk);
        // Probe a chunk (its rows' loads overlap), copy it out, and keep it when no
        // writer changed the stripe meanwhile.
        bool valid = false;
        for (int attempt = 0; attempt < kOptimisticTries && !valid; ++attempt) {
          const uint32_t begin = stripe.ReadBegin();
          if (begin & 1) {  // a writer is changing this stripe right now
            SpinPause();
            continue;
          }
          FindGroup(stripe.map(), *rows_, plan, c, ce, /*prefetch=*/true, /*for_write=*/false);
          PrefetchNextBuckets(plan, ce);
          CopyGroup(plan, c, ce, out);
          valid = stripe.ReadValid(begin);
        }
        if (!valid) {
          // Writers kept getting in the way: read under the lock instead.
          absl::ReaderMutexLock lock(&stripe.mu);
          FindGroup(stripe.current(), *rows_, plan, c, ce, /*prefetch=*/true, false);
          CopyGroup(plan, c, ce, out);
        }
        for (int k = c; k < ce; ++k) {
          if (plan.rows[k] == kNoRow) plan.missing.push_back(plan.order[k]);
        }
      }
      return absl::OkStatus();
    });
  }
  const bool managed = policy_ != v1::EVICTION_NONE;
  if (admission_ != nullptr) insert_missing = false;  // pushes make rows
  for (const int32_t pos : plan.missing) {
    const int64_t id = ids[pos];
    const uint64_t h = MapHash(id);
    float* dst = out + static_cast<size_t>(pos) * dim_;
    if (!insert_missing && !managed) {
      InitialWeights(id, dst);
      continue;
    }
    Stripe& stripe = stripes_[h >> kStripeShift];
    StripeWriter lock(stripe);
    if (const Row row = stripe.Find(h); row != kNoRow) {
      CopyWeightsOut(WeightsOf(row), dst);
      continue;
    }
    if (!insert_missing) {
      // Read-only on an evicting table: a row kept on disk is read, not brought back.
      TESSERA_ASSIGN_OR_RETURN(const bool kept, ReadSpilled(id, dst));
      if (!kept) InitialWeights(id, dst);
      continue;
    }
    TESSERA_ASSIGN_OR_RETURN(const Row row, managed ? InsertManagedLocked(stripe, id, h)
                                                    : FindOrInsertLocked(stripe, id, h));
    CopyWeightsOut(WeightsOf(row), dst);
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::ApplyUniqueGradients(absl::Span<const int64_t> ids, const float* grads,
                                                  int64_t step) {
  TESSERA_RETURN_IF_ERROR(CheckFiniteGradients(name(), ids, grads, dim_));
  return ApplyCheckedGradients(ids, grads, step);
}

absl::Status EmbeddingTable::ApplyCheckedGradients(absl::Span<const int64_t> ids,
                                                   const float* grads, int64_t step) {
  TESSERA_DCHECK(CheckFiniteGradients(name(), ids, grads, dim_).ok());
  NoteStep(step);
  absl::Status applied = fixed_ != nullptr               ? FixedApply(ids, grads, step)
                         : policy_ != v1::EVICTION_NONE ? ApplyManaged(ids, grads, step)
                                                        : ApplyBatch(ids, grads, step);
  TESSERA_RETURN_IF_ERROR(applied);
  // TTL: sweep once the step has moved a quarter of the TTL on since the last sweep.
  if (ttl_steps_ > 0) {
    int64_t due = next_sweep_.load(std::memory_order_relaxed);
    if (step >= due &&
        next_sweep_.compare_exchange_strong(due, step + std::max<int64_t>(1, ttl_steps_ / 4))) {
      ExpireRows(step);
    }
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::CheckRoomFor(absl::Span<const int64_t> ids) const {
  if (fixed_ != nullptr) return CheckIds(ids);  // its memory was counted whole
  if (policy_ != v1::EVICTION_NONE || !CountsAhead(static_cast<int64_t>(ids.size()))) {
    return absl::OkStatus();
  }
  const int64_t missing = MissingRows(ids);
  if (const int64_t budget = row_budget();
      missing > 0 && budget > 0 && num_rows() + missing > budget) {
    return BudgetError();
  }
  if (missing > 0 && memory_ != nullptr && !memory_->HasRoomFor(missing * row_bytes_)) {
    return MemoryBudgetError(missing);
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::ApplyBatch(absl::Span<const int64_t> ids, const float* grads,
                                        int64_t step) {
  StripePlan& plan = embedding_internal::PlanByStripe(ids);
  // With a budget, take it for the rows this batch will create, so that a full table
  // rejects the whole batch before any row changes. Without one there is nothing to check
  // and rows are counted as they are created.
  int64_t reserved = 0;
  if (CountsAhead(static_cast<int64_t>(ids.size()))) {
    (void)ForEachGroup(plan, [&](int s, int b, int e) {
      const Stripe& stripe = stripes_[s];
      absl::ReaderMutexLock lock(&stripe.mu);
      FindGroup(stripe.current(), *rows_, plan, b, e, /*prefetch=*/false, false);
      for (int k = b; k < e; ++k) {
        const int32_t pos = plan.order[k];
        reserved += plan.rows[k] == kNoRow &&
                    (admission_ == nullptr || admission_->WouldAdmit(ids[pos], plan.hash[pos]));
      }
      return absl::OkStatus();
    });
  }
  if (reserved > 0) TESSERA_RETURN_IF_ERROR(TakeRows(reserved));

  if (ThinGroups(ids.size())) {
    ReaderScope reading(*readers_);
    WarmRows(plan, /*for_write=*/true);
  }
  thread_local std::vector<float> scratch;
  scratch.resize(ScratchFloats());
  int64_t refused = 0, first_refused = 0;
  int64_t created = 0, not_admitted = 0;
  TESSERA_RETURN_IF_ERROR(ForEachGroup(plan, [&](int s, int b, int e) {
    Stripe& stripe = stripes_[s];
    StripeWriter lock(stripe);
    for (int c = b; c < e; c += kChunk) {
      const int ce = std::min(e, c + kChunk);
      // The whole row: weights, state and the meta after them (update count, step),
      // which every update reads and writes.
      FindGroup(stripe.current(), *rows_, plan, c, ce, /*prefetch=*/true, /*for_write=*/true);
      PrefetchNextBuckets(plan, ce);
      for (int k = c; k < ce; ++k) {
        const int32_t pos = plan.order[k];
        Row row = plan.rows[k];
        if (row == kNoRow && admission_ != nullptr &&
            !admission_->Count(ids[pos], plan.hash[pos])) {
          ++not_admitted;  // no row yet: the gradient is dropped
          continue;
        }
        if (row == kNoRow) {
          row = InsertLocked(stripe, ids[pos], plan.hash[pos]);
          if (row == kNoRow) {
            AdjustRows(created - reserved);
            return OutOfMemoryError();
          }
          ++created;
        }
        if (!UpdateRowLocked(stripe, ids[pos], row, grads + static_cast<size_t>(pos) * dim_, step,
                             scratch.data()) &&
            refused++ == 0) {
          first_refused = ids[pos];
        }
      }
    }
    return absl::OkStatus();
  }));
  // Another thread may have created some of the reserved rows meanwhile; without a budget
  // nothing was reserved and every created row is counted here.
  if (created != reserved) AdjustRows(created - reserved);
  if (not_admitted > 0) refused_ids_.fetch_add(not_admitted, std::memory_order_relaxed);
  return refused == 0 ? absl::OkStatus() : NonFiniteUpdateError(refused, first_refused);
}

absl::Status EmbeddingTable::PushGradients(absl::Span<const int64_t> ids, const float* grads,
                                           int64_t step) {
  thread_local SummedGradients summed;
  TESSERA_RETURN_IF_ERROR(SumGradients(name(), ids, absl::MakeConstSpan(grads, ids.size() * dim_),
                                       dim_, &summed));
  return ApplyCheckedGradients(summed.ids(), summed.rows(), step);
}

absl::StatusOr<RowSnapshot> EmbeddingTable::ReadRow(int64_t id) const {
  if (fixed_ != nullptr) {
    RowSnapshot snap;
    bool found = false;
    if (fixed_->Holds(id)) {
      ReadRows({id}, [&](int64_t, const float* w, const float* state, const RowMeta& meta) {
        snap.weights.assign(w, w + dim_);
        snap.state.assign(state, state + state_floats_);
        snap.meta = meta;
        found = true;
      });
    }
    if (found) return snap;
    return absl::NotFoundError(absl::StrCat("table '", name(), "': no row for id ", id));
  }
  const uint64_t h = MapHash(id);
  const Stripe& stripe = stripes_[h >> kStripeShift];
  absl::ReaderMutexLock lock(&stripe.mu);
  const Row row = stripe.Find(h);
  if (row == kNoRow) {
    return absl::NotFoundError(absl::StrCat("table '", name(), "': no row for id ", id));
  }
  RowSnapshot snap;
  snap.weights.resize(dim_);
  CopyWeightsOut(WeightsOf(row), snap.weights.data());
  snap.state.assign(StateOf(row), StateOf(row) + state_floats_);
  snap.meta = MetaOf(row);
  return snap;
}

void EmbeddingTable::ReadRows(absl::Span<const int64_t> ids, const RowFn& fn) const {
  if (fixed_ != nullptr) {
    const embedding_internal::FixedRows& f = *fixed_;
    for (const int64_t id : ids) {
      if (!f.Holds(id)) continue;
      const int64_t row = f.RowOf(id);
      absl::ReaderMutexLock lock(&FixedStripe(row).mu);
      if (!f.Live(row)) continue;
      RowMeta meta;
      meta.update_count = f.Count(row);
      fn(id, WeightsView(f.Weights(row)), f.State(row), meta);
    }
    return;
  }
  for (const int64_t id : ids) {
    const uint64_t h = MapHash(id);
    const Stripe& stripe = stripes_[h >> kStripeShift];
    absl::ReaderMutexLock lock(&stripe.mu);
    if (const Row row = stripe.Find(h); row != kNoRow) {
      fn(id, WeightsView(WeightsOf(row)), StateOf(row), MetaOf(row));
    }
  }
}

absl::Status EmbeddingTable::PutRowLocked(Stripe& stripe, uint64_t h, const float* weights,
                                          const float* state, const RowMeta& meta,
                                          bool mark_dirty) {
  Row row = stripe.Find(h);
  if (row == kNoRow) {
    TESSERA_RETURN_IF_ERROR(TakeRows(1));
    // Not initialised: every field is written below.
    row = stripe.Insert(h);
    if (row == kNoRow) {
      AdjustRows(-1);
      return OutOfMemoryError();
    }
  }
  NoteStep(meta.last_step);
  stripe.BeginChange();
  StoreWeights(weights, WeightsOf(row));
  std::copy(state, state + state_floats_, StateOf(row));
  SetMeta(row, meta);
  if (mark_dirty) MarkDirtyLocked(stripe, row);
  return absl::OkStatus();
}

absl::Status EmbeddingTable::PutRow(int64_t id, absl::Span<const float> weights,
                                    absl::Span<const float> state, const RowMeta& meta,
                                    bool mark_dirty) {
  if (weights.size() != static_cast<size_t>(dim_) ||
      state.size() != static_cast<size_t>(state_floats_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", name(), "': row ", id, " has ", weights.size(), " weights and ",
                     state.size(), " state floats, expected ", dim_, " and ", state_floats_));
  }
  if (fixed_ != nullptr) return FixedPutRow(id, weights.data(), state.data(), meta, mark_dirty);
  const uint64_t h = MapHash(id);
  Stripe& stripe = stripes_[h >> kStripeShift];
  StripeWriter lock(stripe);
  return PutRowLocked(stripe, h, weights.data(), state.data(), meta, mark_dirty);
}

absl::Status EmbeddingTable::Reserve(int64_t rows) {
  if (fixed_ != nullptr) return absl::OkStatus();  // every row has its place
  // Ids spread over the stripes evenly, give or take a few standard deviations.
  const int64_t per_stripe = rows / kNumStripes;
  const int64_t want = per_stripe + 4 * static_cast<int64_t>(std::sqrt(per_stripe)) + 16;
  for (int s = 0; s < kNumStripes; ++s) {
    StripeWriter lock(stripes_[s]);
    if (!stripes_[s].Reserve(want)) return OutOfMemoryError();
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::PutRows(absl::Span<const int64_t> ids, const float* weights,
                                     const float* state, absl::Span<const RowMeta> metas) {
  if (fixed_ != nullptr) {
    for (size_t i = 0; i < ids.size(); ++i) {
      TESSERA_RETURN_IF_ERROR(FixedPutRow(ids[i], weights + i * dim_, state + i * state_floats_,
                                          metas[i], /*mark_dirty=*/false));
    }
    return absl::OkStatus();
  }
  StripePlan& plan = embedding_internal::PlanByStripe(ids);
  return ForEachGroup(plan, [&](int s, int b, int e) {
    Stripe& stripe = stripes_[s];
    StripeWriter lock(stripe);
    for (int k = b; k < e; ++k) {
      const size_t pos = static_cast<size_t>(plan.order[k]);
      TESSERA_RETURN_IF_ERROR(PutRowLocked(stripe, plan.hash[pos], weights + pos * dim_,
                                           state + pos * state_floats_, metas[pos],
                                           /*mark_dirty=*/false));
    }
    return absl::OkStatus();
  });
}

void EmbeddingTable::Forget(int64_t id) {
  if (fixed_ != nullptr) return FixedForget(id);
  const uint64_t h = MapHash(id);
  Stripe& stripe = stripes_[h >> kStripeShift];
  StripeWriter lock(stripe);
  EraseLocked(stripe, h);
}

void EmbeddingTable::ForEachDirtyRow(const RowFn& fn) const {
  if (fixed_ != nullptr) return FixedForEach(fn, /*dirty_only=*/true);
  if (DirtyRows() > 0) ScanRows(fn, /*dirty_only=*/true);
}

void EmbeddingTable::ScanRows(const RowFn& fn, bool dirty_only) const {
  for (int s = 0; s < kNumStripes; ++s) {
    const Stripe& stripe = stripes_[s];
    absl::ReaderMutexLock lock(&stripe.mu);
    const IdMap* map = stripe.current();
    for (uint64_t pos = 0; map != nullptr && pos < map->capacity(); ++pos) {
      const MapEntry& e = map->Slot(pos);
      if (e.row == kNoRow || (dirty_only && !rows_->Dirty(e.row))) continue;
      fn(MapId(e.hash), WeightsView(WeightsOf(e.row)), StateOf(e.row), MetaOf(e.row));
    }
  }
}

int64_t EmbeddingTable::DirtyRows() const {
  if (fixed_ != nullptr) return fixed_->dirty_rows();
  return dirty_rows_.load(std::memory_order_relaxed);
}

void EmbeddingTable::ClearDirty() {
  if (fixed_ != nullptr) return FixedClearDirty();
  for (int s = 0; s < kNumStripes && DirtyRows() > 0; ++s) {
    Stripe& stripe = stripes_[s];
    StripeWriter lock(stripe);
    const IdMap* map = stripe.current();
    for (uint64_t pos = 0; map != nullptr && pos < map->capacity(); ++pos) {
      const uint32_t row = map->Slot(pos).row;
      if (row != kNoRow && rows_->ClearDirty(row)) {
        dirty_rows_.fetch_sub(1, std::memory_order_relaxed);
      }
    }
  }
}

void EmbeddingTable::ForEachRow(const RowFn& fn) const {
  if (fixed_ != nullptr) return FixedForEach(fn, /*dirty_only=*/false);
  ScanRows(fn, /*dirty_only=*/false);
}

int64_t EmbeddingTable::MemoryBytes() const {
  int64_t bytes = ReservedBytes() + (fixed_ == nullptr ? rows_->Bytes() : 0);
  for (int s = 0; s < kNumStripes; ++s) {
    absl::ReaderMutexLock lock(&stripes_[s].mu);
    bytes += stripes_[s].Bytes();
  }
  return bytes;
}

int64_t EmbeddingTable::ReservedBytes() const {
  return (fixed_ != nullptr ? fixed_->ReservedBytes() : 0) +
         (admission_ != nullptr ? admission_->bytes() : 0);
}

}  // namespace tessera::embedding
