#include "embedding/embedding_table.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
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

namespace tessera::embedding {

using embedding_internal::CopyFloats;
using embedding_internal::IdMap;
using embedding_internal::kNoRow;
using embedding_internal::kStripeShift;
using embedding_internal::MapHash;
using embedding_internal::PackedMeta;
using embedding_internal::RowStore;

static_assert(EmbeddingTable::kNumStripes == embedding_internal::kNumStripes);

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

}  // namespace tessera::embedding
