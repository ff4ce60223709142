#include "embedding/embedding_table.h"

#include <sys/mman.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "embedding/batch_ops.h"
#include "embedding/dtype.h"
#include "embedding/sharding.h"
#include "embedding/status.h"

namespace tessera::embedding {
namespace {

// What sits after a row's optimizer state: the public RowMeta and a dirty flag.
struct StoredMetaLayout {
  RowMeta meta;
  uint32_t dirty = 0;  // 0: clean; else 1 + the row's place in its stripe's dirty list
};
constexpr int kMetaFloats = sizeof(StoredMetaLayout) / sizeof(float);
constexpr uint64_t kMapSalt = 0x5be0cd19137e2179ULL;
constexpr uint64_t kInitSalt = 0x6a09e667f3bcc908ULL;
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kMaxSlabBytes = size_t{4} << 20;
constexpr int kStripeShift = 58;  // 64 - log2(kNumStripes)

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// `bytes` of 64-byte-aligned memory. Blocks of 2 MiB or more are 2 MiB aligned and
// advised for transparent huge pages: random rows over gigabytes would otherwise miss
// the TLB on nearly every access. Null when out of memory.
void* AllocateBlock(size_t bytes) {
  if (bytes >= kHugePage) {
    bytes = RoundUp(bytes, kHugePage);
    void* p = std::aligned_alloc(kHugePage, bytes);
    if (p != nullptr) madvise(p, bytes, MADV_HUGEPAGE);
    return p;
  }
  return std::aligned_alloc(64, RoundUp(bytes, 64));
}

// A zero-filled array of trivially copyable T from AllocateBlock.
template <typename T>
class BlockArray {
 public:
  BlockArray() = default;
  explicit BlockArray(size_t n)
      : data_(static_cast<T*>(AllocateBlock(n * sizeof(T)))), size_(data_ ? n : 0) {
    if (data_) std::memset(static_cast<void*>(data_.get()), 0, n * sizeof(T));
  }
  T* data() const { return data_.get(); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) const { return data_.get()[i]; }
  T* begin() const { return data_.get(); }
  T* end() const { return data_.get() + size_; }

 private:
  std::unique_ptr<T, AlignedFree> data_;
  size_t size_ = 0;
};

uint64_t MapHash(int64_t id) { return Mix64(static_cast<uint64_t>(id) ^ kMapSalt); }

// Uniform in [0, 1) from the top 24 bits.
float UnitFloat(uint64_t bits) { return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f); }

}  // namespace

struct EmbeddingTable::Stripe {
  struct Entry {
    int64_t id;
    float* row;  // nullptr: empty slot
  };

  mutable absl::Mutex mu;
  BlockArray<Entry> entries ABSL_GUARDED_BY(mu);  // power-of-two size, linear probing
  uint64_t mask ABSL_GUARDED_BY(mu) = 0;
  int64_t size ABSL_GUARDED_BY(mu) = 0;
  std::vector<std::unique_ptr<float, AlignedFree>> slabs ABSL_GUARDED_BY(mu);  // never move
  float* bump ABSL_GUARDED_BY(mu) = nullptr;
  int64_t bump_left ABSL_GUARDED_BY(mu) = 0;
  int64_t next_slab_rows ABSL_GUARDED_BY(mu) = 16;
  int64_t slab_bytes ABSL_GUARDED_BY(mu) = 0;
  std::vector<Entry> dirty ABSL_GUARDED_BY(mu);       // rows updated since the last ClearDirty
  std::vector<float*> free_rows ABSL_GUARDED_BY(mu);  // rows of erased entries, for reuse
  uint64_t sample_state ABSL_GUARDED_BY(mu) = 0x9e3779b97f4a7c15ULL;  // eviction sampling

  // The slot of `id`, or -1.
  int64_t FindSlot(int64_t id, uint64_t h) const ABSL_SHARED_LOCKS_REQUIRED(mu) {
    if (entries.empty()) return -1;
    uint64_t pos = h & mask;
    while (true) {
      const Entry& e = entries[pos];
      if (e.row == nullptr) return -1;
      if (e.id == id) return static_cast<int64_t>(pos);
      pos = (pos + 1) & mask;
    }
  }

  // Empties slot `pos` and shifts later entries of its probe run back, so every entry
  // stays reachable from its home slot without tombstones.
  void EraseSlot(uint64_t pos) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    entries[pos] = Entry{0, nullptr};
    uint64_t hole = pos;
    for (uint64_t j = (pos + 1) & mask; entries[j].row != nullptr; j = (j + 1) & mask) {
      const uint64_t home = MapHash(entries[j].id) & mask;
      // Entry j may fill the hole unless its home lies cyclically in (hole, j].
      const bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
      if (!stays) {
        entries[hole] = entries[j];
        entries[j] = Entry{0, nullptr};
        hole = j;
      }
    }
    --size;
  }

  float* Find(int64_t id, uint64_t h) const ABSL_SHARED_LOCKS_REQUIRED(mu) {
    if (entries.empty()) return nullptr;
    uint64_t pos = h & mask;
    while (true) {
      const Entry& e = entries[pos];
      if (e.row == nullptr) return nullptr;
      if (e.id == id) return e.row;
      pos = (pos + 1) & mask;
    }
  }

  void Place(int64_t id, uint64_t h, float* row) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    uint64_t pos = h & mask;
    while (entries[pos].row != nullptr) pos = (pos + 1) & mask;
    entries[pos] = Entry{id, row};
  }

  // Grows the map so one more entry keeps the load factor at or under 1/2. False when
  // out of memory (the map is unchanged).
  bool ReserveOne() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (static_cast<uint64_t>(size + 1) * 2 <= entries.size()) return true;
    const size_t cap = entries.empty() ? 16 : entries.size() * 2;
    BlockArray<Entry> grown(cap);
    if (grown.empty()) return false;
    BlockArray<Entry> old = std::move(entries);
    entries = std::move(grown);
    mask = cap - 1;
    for (const Entry& e : old) {
      if (e.row != nullptr) Place(e.id, MapHash(e.id), e.row);
    }
    return true;
  }

  float* AllocateRow(int stride_floats) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!free_rows.empty()) {
      float* row = free_rows.back();
      free_rows.pop_back();
      return row;
    }
    if (bump_left == 0) {
      const int64_t rows = next_slab_rows;
      const size_t bytes = static_cast<size_t>(rows) * stride_floats * sizeof(float);
      float* slab = static_cast<float*>(AllocateBlock(bytes));
      if (slab == nullptr) return nullptr;
      slabs.emplace_back(slab);
      slab_bytes += static_cast<int64_t>(bytes);
      bump = slab;
      bump_left = rows;
      if (bytes < kMaxSlabBytes) next_slab_rows *= 2;
    }
    float* row = bump;
    bump += stride_floats;
    --bump_left;
    return row;
  }
};

absl::Status ValidateTableConfig(const v1::TableConfig& config) {
  if (config.name().empty()) return absl::InvalidArgumentError("table name must not be empty");
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
  absl::StatusOr<OptimizerParams> params = ResolveOptimizer(config.optimizer());
  return Annotate(params.status(), label);
}

absl::StatusOr<std::unique_ptr<EmbeddingTable>> EmbeddingTable::Create(
    const v1::TableConfig& config, int64_t row_budget) {
  TESSERA_RETURN_IF_ERROR(ValidateTableConfig(config));
  if (row_budget < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", config.name(), "': row budget must be >= 0, got ", row_budget));
  }
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                           Optimizer::Create(config.optimizer(), config.dim()));
  return std::unique_ptr<EmbeddingTable>(
      new EmbeddingTable(config, row_budget, std::move(optimizer)));
}

EmbeddingTable::EmbeddingTable(const v1::TableConfig& config, int64_t row_budget,
                               std::unique_ptr<Optimizer> optimizer)
    : config_(config),
      dim_(config.dim()),
      dtype_(config.dtype()),
      weight_floats_((config.dim() * DtypeBytes(config.dtype()) + 3) / 4),
      state_floats_(optimizer->StateFloats()),
      row_budget_(row_budget),
      optimizer_(std::move(optimizer)),
      policy_(config.eviction().policy()),
      ttl_steps_(config.eviction().ttl_steps()),
      stripes_(new Stripe[kNumStripes]) {
  // Meta is 8-byte aligned: put it at an even float offset.
  meta_at_ = weight_floats_ + state_floats_;
  meta_at_ += meta_at_ & 1;
  stride_floats_ = (meta_at_ + kMetaFloats + 15) / 16 * 16;
  init_type_ = config.initializer().type() == v1::INITIALIZER_UNSPECIFIED
                   ? v1::UNIFORM
                   : config.initializer().type();
  init_scale_ = config.initializer().has_scale() ? config.initializer().scale()
                                                 : 1.0f / std::sqrt(static_cast<float>(dim_));
  init_key_ = Mix64(config.seed() ^ kInitSalt);
}

EmbeddingTable::~EmbeddingTable() = default;

struct EmbeddingTable::StoredMeta : StoredMetaLayout {};

void EmbeddingTable::InitialWeights(int64_t id, float* out) const {
  const uint64_t base = Mix64(init_key_ ^ static_cast<uint64_t>(id));
  auto bits = [base](int j) { return Mix64(base + static_cast<uint64_t>(j + 1) * kGolden); };
  switch (init_type_) {
    case v1::ZEROS:
      std::fill(out, out + dim_, 0.0f);
      break;
    case v1::NORMAL:
      // Box-Muller over pairs of columns; u1 is kept away from 0.
      for (int j = 0; j < dim_; j += 2) {
        const float u1 = UnitFloat(bits(j)) + 0.5f / 16777216.0f;
        const float u2 = UnitFloat(bits(j + 1));
        const float r = std::sqrt(-2.0f * std::log(u1)) * init_scale_;
        const float theta = 2.0f * std::numbers::pi_v<float> * u2;
        out[j] = r * std::cos(theta);
        if (j + 1 < dim_) out[j + 1] = r * std::sin(theta);
      }
      break;
    default:
      for (int j = 0; j < dim_; ++j) out[j] = (2.0f * UnitFloat(bits(j)) - 1.0f) * init_scale_;
      break;
  }
  if (dtype_ != v1::FP32) {
    // What a stored row of this dtype holds.
    thread_local std::vector<uint16_t> half;
    half.resize(dim_);
    EncodeWeights(dtype_, out, dim_, half.data());
    DecodeWeights(dtype_, half.data(), dim_, out);
  }
}

void EmbeddingTable::InitRow(int64_t id, float* row) const {
  if (dtype_ == v1::FP32) {
    InitialWeights(id, row);
  } else {
    thread_local std::vector<float> w;
    w.resize(dim_);
    InitialWeights(id, w.data());
    StoreWeights(w.data(), row);
  }
  optimizer_->InitState(StateOf(row));
  *StoredMetaOf(row) = StoredMeta{};
}

void EmbeddingTable::CopyWeightsOut(const float* row, float* out) const {
  if (dtype_ == v1::FP32) {
    std::memcpy(out, row, static_cast<size_t>(dim_) * sizeof(float));
  } else {
    DecodeWeights(dtype_, row, dim_, out);
  }
}

const float* EmbeddingTable::WeightsView(const float* row) const {
  if (dtype_ == v1::FP32) return row;
  thread_local std::vector<float> w;
  w.resize(dim_);
  DecodeWeights(dtype_, row, dim_, w.data());
  return w.data();
}

void EmbeddingTable::StoreWeights(const float* w, float* row) const {
  EncodeWeights(dtype_, w, dim_, row);
}

namespace {

// True when every value of p[0, n) is finite: Inf and NaN have an exponent of all ones,
// so ~bits & exponent is 0 for them alone. A min over integers, which vectorises (a float
// reduction would be a serial chain).
bool AllFinite(const float* p, size_t n) {
  constexpr uint32_t kExponent = 0x7f800000u;
  uint32_t least = kExponent;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + i, sizeof(bits));
    least = std::min(least, ~bits & kExponent);
  }
  return least != 0;
}

}  // namespace

bool EmbeddingTable::UpdateRowLocked(Stripe& stripe, int64_t id, float* row, const float* grad,
                                     int64_t step, float* scratch) {
  const size_t d = static_cast<size_t>(dim_);
  const size_t sf = static_cast<size_t>(state_floats_);
  float* g = scratch;
  float* saved = scratch + d;  // the row's values before the step, to put back
  std::memcpy(g, grad, d * sizeof(float));
  StoredMeta* stored = StoredMetaOf(row);
  const int64_t prior = stored->meta.update_count;
  float* state = StateOf(row);
  if (dtype_ == v1::FP32) {
    // Weights and state are contiguous in the row: one copy saves both.
    std::memcpy(saved, row, (d + sf) * sizeof(float));
    optimizer_->Update(row, state, g, prior);
    // A weight or accumulator that overflowed would be stored, served and checkpointed;
    // the row keeps its last finite values instead.
    if (!AllFinite(row, d + sf)) {  // weights and state, contiguous
      std::memcpy(row, saved, (d + sf) * sizeof(float));
      return false;
    }
  } else {
    float* widened = saved + sf;
    std::memcpy(saved, state, sf * sizeof(float));
    DecodeWeights(dtype_, row, dim_, widened);
    optimizer_->Update(widened, state, g, prior);
    if (!AllFinite(widened, d) || !AllFinite(state, sf)) {
      std::memcpy(state, saved, sf * sizeof(float));
      return false;
    }
    const uint64_t seed = Mix64(init_key_ ^ Mix64(static_cast<uint64_t>(id)) ^
                                (static_cast<uint64_t>(prior) * kGolden));
    EncodeWeightsStochastic(dtype_, widened, dim_, seed, row);
  }
  stored->meta.update_count = prior + 1;
  stored->meta.last_step = step;
  if (stored->dirty == 0) MarkDirtyLocked(stripe, id, row);
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
  return absl::ResourceExhaustedError(absl::StrCat("table '", name(), "': row budget of ",
                                                   row_budget_,
                                                   " rows is full; raise max_rows or add shards"));
}

absl::Status EmbeddingTable::OutOfMemoryError() const {
  return absl::ResourceExhaustedError(
      absl::StrCat("table '", name(), "': out of memory allocating rows"));
}

float* EmbeddingTable::FindOrInsertLocked(Stripe& stripe, int64_t id, uint64_t hash) {
  if (float* row = stripe.Find(id, hash)) return row;
  if (!stripe.ReserveOne()) return nullptr;
  float* row = stripe.AllocateRow(stride_floats_);
  if (row == nullptr) return nullptr;
  InitRow(id, row);
  stripe.Place(id, hash, row);
  ++stripe.size;
  return row;
}

void EmbeddingTable::MarkDirtyLocked(Stripe& stripe, int64_t id, float* row) {
  stripe.dirty.push_back(Stripe::Entry{id, row});
  StoredMetaOf(row)->dirty = static_cast<uint32_t>(stripe.dirty.size());
}

void EmbeddingTable::EraseLocked(Stripe& stripe, int64_t id, uint64_t hash) {
  const int64_t pos = stripe.FindSlot(id, hash);
  if (pos < 0) return;
  float* row = stripe.entries[pos].row;
  StoredMeta* stored = StoredMetaOf(row);
  if (stored->dirty != 0) {  // swap-remove from the dirty list
    const size_t at = stored->dirty - 1;
    stripe.dirty[at] = stripe.dirty.back();
    StoredMetaOf(stripe.dirty[at].row)->dirty = static_cast<uint32_t>(at + 1);
    stripe.dirty.pop_back();
    stored->dirty = 0;
  }
  stripe.EraseSlot(static_cast<uint64_t>(pos));
  stripe.free_rows.push_back(row);
  num_rows_.fetch_sub(1, std::memory_order_relaxed);
}

absl::Status EmbeddingTable::EvictOneLocked(Stripe& stripe) {
  if (stripe.size == 0) {
    // Evict from another stripe whose lock is free right now (waiting could deadlock with
    // a thread doing the same the other way round); if none is, go one row over budget.
    for (int k = 1; k < kNumStripes; ++k) {
      Stripe& other = stripes_[(&stripe - stripes_.get() + k) % kNumStripes];
      if (!other.mu.TryLock()) continue;
      const bool has_rows = other.size > 0;
      absl::Status s = has_rows ? EvictOneLocked(other) : absl::OkStatus();
      other.mu.Unlock();
      if (!s.ok() || has_rows) return s;
    }
    return absl::OkStatus();
  }
  // Sample up to 8 rows from a random place in the map and evict the coldest of them.
  constexpr int kSamples = 8;
  uint64_t& x = stripe.sample_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  uint64_t pos = x & stripe.mask;
  const Stripe::Entry* victim = nullptr;
  auto colder = [this](const Stripe::Entry& a, const Stripe::Entry& b) {
    const RowMeta& ma = *MetaOf(a.row);
    const RowMeta& mb = *MetaOf(b.row);
    if (policy_ == v1::EVICTION_LFU) {
      return ma.update_count != mb.update_count ? ma.update_count < mb.update_count
                                                : ma.last_step < mb.last_step;
    }
    return ma.last_step != mb.last_step ? ma.last_step < mb.last_step
                                        : ma.update_count < mb.update_count;
  };
  for (int found = 0; found < kSamples && found < stripe.size; pos = (pos + 1) & stripe.mask) {
    const Stripe::Entry& e = stripe.entries[pos];
    if (e.row == nullptr) continue;
    ++found;
    if (victim == nullptr || colder(e, *victim)) victim = &e;
  }
  const int64_t id = victim->id;
  float* row = victim->row;
  if (spill_ != nullptr) {
    TESSERA_RETURN_IF_ERROR(spill_->Evict(id, WeightsView(row), StateOf(row), *MetaOf(row),
                                          StoredMetaOf(row)->dirty != 0));
  }
  EraseLocked(stripe, id, MapHash(id));
  evictions_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::StatusOr<float*> EmbeddingTable::InsertManagedLocked(Stripe& stripe, int64_t id,
                                                           uint64_t hash) {
  if (row_budget_ > 0 && num_rows_.load(std::memory_order_relaxed) >= row_budget_) {
    TESSERA_RETURN_IF_ERROR(EvictOneLocked(stripe));
  }
  num_rows_.fetch_add(1, std::memory_order_relaxed);
  float* row = FindOrInsertLocked(stripe, id, hash);
  if (row == nullptr) {
    num_rows_.fetch_sub(1, std::memory_order_relaxed);
    return OutOfMemoryError();
  }
  if (spill_ != nullptr) {
    RowMeta meta;
    bool dirty = false;
    thread_local std::vector<float> weights;
    weights.resize(dim_);
    absl::StatusOr<bool> kept = spill_->Fetch(id, weights.data(), StateOf(row), &meta, &dirty);
    if (!kept.ok()) {
      EraseLocked(stripe, id, hash);
      return kept.status();
    }
    const int64_t latest = latest_step_.load(std::memory_order_relaxed);
    if (*kept && ttl_steps_ > 0 && latest - meta.last_step > ttl_steps_) {
      spill_->Drop(id);  // expired while on disk: starts afresh
      InitRow(id, row);
      expirations_.fetch_add(1, std::memory_order_relaxed);
    } else if (*kept) {
      StoreWeights(weights.data(), row);
      StoredMetaOf(row)->meta = meta;
      if (dirty) MarkDirtyLocked(stripe, id, row);
    }
  }
  return row;
}

absl::Status EmbeddingTable::ApplyManaged(absl::Span<const int64_t> ids, const float* grads,
                                          int64_t step) {
  thread_local std::vector<float> scratch;
  scratch.resize(ScratchFloats());
  int64_t refused = 0, first_refused = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint64_t h = MapHash(ids[i]);
    Stripe& stripe = stripes_[h >> kStripeShift];
    absl::MutexLock lock(&stripe.mu);
    float* row = stripe.Find(ids[i], h);
    if (row == nullptr) {
      TESSERA_ASSIGN_OR_RETURN(row, InsertManagedLocked(stripe, ids[i], h));
    }
    if (!UpdateRowLocked(stripe, ids[i], row, grads + i * dim_, step, scratch.data()) &&
        refused++ == 0) {
      first_refused = ids[i];
    }
  }
  return refused == 0 ? absl::OkStatus() : NonFiniteUpdateError(refused, first_refused);
}

void EmbeddingTable::ExpireRows(int64_t step) {
  std::vector<int64_t> expired;
  for (int s = 0; s < kNumStripes; ++s) {
    Stripe& stripe = stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    expired.clear();
    for (const Stripe::Entry& e : stripe.entries) {
      if (e.row != nullptr && step - MetaOf(e.row)->last_step > ttl_steps_) expired.push_back(e.id);
    }
    for (const int64_t id : expired) {
      EraseLocked(stripe, id, MapHash(id));
      if (spill_ != nullptr) spill_->Drop(id);
    }
    expirations_.fetch_add(static_cast<int64_t>(expired.size()), std::memory_order_relaxed);
  }
}

namespace {

// Ids probed (and their rows prefetched) before the first of them is used.
constexpr int kChunk = 32;

// A batch's ids grouped by stripe, so each stripe's lock is taken once per batch and
// the map and row loads of many ids are in flight together.
struct StripePlan {
  std::vector<uint64_t> hash;    // (ids) map hash of each id
  std::vector<int32_t> order;    // positions of the ids, grouped by stripe
  std::vector<int32_t> begin;    // (stripes + 1) group bounds in `order`
  std::vector<float*> rows;      // (ids) row found for order[k], or null
  std::vector<int32_t> missing;  // positions whose row does not exist
  std::vector<int32_t> cursor;
};

StripePlan& PlanByStripe(absl::Span<const int64_t> ids) {
  thread_local StripePlan plan;
  const size_t n = ids.size();
  plan.hash.resize(n);
  plan.order.resize(n);
  plan.rows.resize(n);
  plan.missing.clear();
  plan.begin.assign(EmbeddingTable::kNumStripes + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    plan.hash[i] = MapHash(ids[i]);
    ++plan.begin[(plan.hash[i] >> kStripeShift) + 1];
  }
  for (int s = 0; s < EmbeddingTable::kNumStripes; ++s) plan.begin[s + 1] += plan.begin[s];
  plan.cursor.assign(plan.begin.begin(), plan.begin.end() - 1);
  for (size_t i = 0; i < n; ++i) {
    plan.order[plan.cursor[plan.hash[i] >> kStripeShift]++] = static_cast<int32_t>(i);
  }
  return plan;
}

void PrefetchLines(const float* p, int lines, bool for_write) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int l = 0; l < lines; ++l) {
    if (for_write) {
      __builtin_prefetch(c + 64 * l, 1, 3);
    } else {
      __builtin_prefetch(c + 64 * l, 0, 3);
    }
  }
}

}  // namespace

// Finds the rows of group [b, e) of `plan` in `stripe` (whose lock the caller holds) into
// plan.rows[b..e): the map slot of id j is prefetched while id j - 8 is probed and its
// first `row_lines` cache lines are prefetched, so the caller's pass over the rows that
// follows finds them on their way.
template <typename Stripe>
static void FindGroup(const Stripe& stripe, absl::Span<const int64_t> ids, StripePlan& plan, int b,
                      int e, int row_lines, bool for_write) {
  constexpr int kAhead = 8;
  const auto* entries = stripe.entries.data();
  const uint64_t mask = stripe.mask;
  const bool empty = stripe.entries.empty();
  for (int j = b; j < e + kAhead; ++j) {
    if (j < e && !empty) __builtin_prefetch(&entries[plan.hash[plan.order[j]] & mask], 0, 3);
    const int k = j - kAhead;
    if (k >= b) {
      const int32_t pos = plan.order[k];
      float* row = stripe.Find(ids[pos], plan.hash[pos]);
      plan.rows[k] = row;
      if (row != nullptr) PrefetchLines(row, row_lines, for_write);
    }
  }
}

absl::Status EmbeddingTable::Lookup(absl::Span<const int64_t> ids, float* out,
                                    bool insert_missing) {
  const size_t row_bytes = static_cast<size_t>(dim_) * sizeof(float);
  const int row_lines = static_cast<int>((static_cast<size_t>(weight_floats_) * 4 + 63) / 64);
  StripePlan& plan = PlanByStripe(ids);
  for (int s = 0; s < kNumStripes; ++s) {
    const int b = plan.begin[s];
    const int e = plan.begin[s + 1];
    if (b == e) continue;
    Stripe& stripe = stripes_[s];
    absl::ReaderMutexLock lock(&stripe.mu);
    // Probe a chunk (its rows' loads overlap), then copy the chunk out.
    for (int c = b; c < e; c += kChunk) {
      const int ce = std::min(e, c + kChunk);
      FindGroup(stripe, ids, plan, c, ce, row_lines, /*for_write=*/false);
      for (int k = c; k < ce; ++k) {
        const int32_t pos = plan.order[k];
        if (plan.rows[k] != nullptr) {
          CopyWeightsOut(plan.rows[k], out + static_cast<size_t>(pos) * dim_);
        } else {
          plan.missing.push_back(pos);
        }
      }
    }
  }
  const bool managed = policy_ != v1::EVICTION_NONE;
  for (const int32_t pos : plan.missing) {
    const int64_t id = ids[pos];
    const uint64_t h = plan.hash[pos];
    float* dst = out + static_cast<size_t>(pos) * dim_;
    if (managed) {
      Stripe& stripe = stripes_[h >> kStripeShift];
      absl::MutexLock lock(&stripe.mu);
      if (const float* row = stripe.Find(id, h)) {
        CopyWeightsOut(row, dst);
        continue;
      }
      if (!insert_missing) {
        // Read-only: a row kept on disk is read, not brought back.
        thread_local std::vector<float> weights, state;
        weights.resize(dim_);
        state.resize(state_floats_);
        RowMeta meta;
        bool dirty = false;
        bool kept = false;
        if (spill_ != nullptr) {
          TESSERA_ASSIGN_OR_RETURN(kept,
                                   spill_->Fetch(id, weights.data(), state.data(), &meta, &dirty));
        }
        if (kept) {
          std::memcpy(dst, weights.data(), row_bytes);
        } else {
          InitialWeights(id, dst);
        }
        continue;
      }
      TESSERA_ASSIGN_OR_RETURN(float* row, InsertManagedLocked(stripe, id, h));
      CopyWeightsOut(row, dst);
      continue;
    }
    if (!insert_missing) {
      InitialWeights(id, dst);
      continue;
    }
    Stripe& stripe = stripes_[h >> kStripeShift];
    absl::MutexLock lock(&stripe.mu);
    if (const float* row = stripe.Find(id, h)) {
      CopyWeightsOut(row, dst);
      continue;
    }
    if (num_rows_.fetch_add(1, std::memory_order_relaxed) >= row_budget_ && row_budget_ > 0) {
      num_rows_.fetch_sub(1, std::memory_order_relaxed);
      return BudgetError();
    }
    float* row = FindOrInsertLocked(stripe, id, h);
    if (row == nullptr) {
      num_rows_.fetch_sub(1, std::memory_order_relaxed);
      return OutOfMemoryError();
    }
    CopyWeightsOut(row, dst);
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::ApplyUniqueGradients(absl::Span<const int64_t> ids, const float* grads,
                                                  int64_t step) {
  TESSERA_RETURN_IF_ERROR(CheckFiniteGradients(name(), ids, grads, dim_));
  int64_t latest = latest_step_.load(std::memory_order_relaxed);
  while (step > latest && !latest_step_.compare_exchange_weak(latest, step)) {
  }
  absl::Status applied =
      policy_ != v1::EVICTION_NONE ? ApplyManaged(ids, grads, step) : ApplyBatch(ids, grads, step);
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
  if (row_budget_ <= 0 || policy_ != v1::EVICTION_NONE) return absl::OkStatus();
  int64_t present = 0;
  ReadRows(ids, [&](int64_t, const float*, const float*, const RowMeta&) { ++present; });
  const int64_t missing = static_cast<int64_t>(ids.size()) - present;
  if (missing > 0 && num_rows() + missing > row_budget_) return BudgetError();
  return absl::OkStatus();
}

absl::Status EmbeddingTable::ApplyBatch(absl::Span<const int64_t> ids, const float* grads,
                                        int64_t step) {
  StripePlan& plan = PlanByStripe(ids);
  // With a budget, reserve it for the rows this batch will create, so that a full table
  // rejects the whole batch before any row changes. Without one there is nothing to check
  // and rows are counted as they are created.
  int64_t reserved = 0;
  for (int s = 0; s < kNumStripes && row_budget_ > 0; ++s) {
    const int b = plan.begin[s];
    const int e = plan.begin[s + 1];
    if (b == e) continue;
    Stripe& stripe = stripes_[s];
    absl::ReaderMutexLock lock(&stripe.mu);
    FindGroup(stripe, ids, plan, b, e, 0, false);
    for (int k = b; k < e; ++k) reserved += plan.rows[k] == nullptr;
  }
  if (reserved > 0) {
    const int64_t before = num_rows_.fetch_add(reserved, std::memory_order_relaxed);
    if (before + reserved > row_budget_) {
      num_rows_.fetch_sub(reserved, std::memory_order_relaxed);
      return BudgetError();
    }
  }

  thread_local std::vector<float> scratch;
  scratch.resize(ScratchFloats());
  int64_t refused = 0, first_refused = 0;
  // The whole row: weights, state and the meta after them (update count, dirty flag),
  // which every update reads and writes.
  const int row_lines = stride_floats_ / 16;
  int64_t created = 0;
  for (int s = 0; s < kNumStripes; ++s) {
    const int b = plan.begin[s];
    const int e = plan.begin[s + 1];
    if (b == e) continue;
    Stripe& stripe = stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    for (int c = b; c < e; c += kChunk) {
      const int ce = std::min(e, c + kChunk);
      FindGroup(stripe, ids, plan, c, ce, row_lines, /*for_write=*/true);
      for (int k = c; k < ce; ++k) {
        const int32_t pos = plan.order[k];
        float* row = plan.rows[k];
        if (row == nullptr) {
          row = FindOrInsertLocked(stripe, ids[pos], plan.hash[pos]);
          if (row == nullptr) {
            num_rows_.fetch_add(created - reserved, std::memory_order_relaxed);
            return OutOfMemoryError();
          }
          ++created;
        }
        if (!UpdateRowLocked(stripe, ids[pos], row, grads + static_cast<size_t>(pos) * dim_,
                             step, scratch.data()) &&
            refused++ == 0) {
          first_refused = ids[pos];
        }
      }
    }
  }
  // Another thread may have created some of the reserved rows meanwhile; without a budget
  // nothing was reserved and every created row is counted here.
  if (created != reserved) num_rows_.fetch_add(created - reserved, std::memory_order_relaxed);
  return refused == 0 ? absl::OkStatus() : NonFiniteUpdateError(refused, first_refused);
}

absl::Status EmbeddingTable::PushGradients(absl::Span<const int64_t> ids, const float* grads,
                                           int64_t step) {
  thread_local std::vector<int64_t> unique_ids;
  thread_local std::vector<int32_t> inverse;
  thread_local std::vector<float> summed;
  Unique(ids, &unique_ids, &inverse);
  summed.assign(unique_ids.size() * dim_, 0.0f);
  SumRowsByInverse(grads, dim_, inverse, summed.data());
  return ApplyUniqueGradients(unique_ids, summed.data(), step);
}

absl::StatusOr<RowSnapshot> EmbeddingTable::ReadRow(int64_t id) const {
  const uint64_t h = MapHash(id);
  Stripe& stripe = stripes_[h >> kStripeShift];
  absl::ReaderMutexLock lock(&stripe.mu);
  const float* row = stripe.Find(id, h);
  if (row == nullptr) {
    return absl::NotFoundError(absl::StrCat("table '", name(), "': no row for id ", id));
  }
  RowSnapshot snap;
  snap.weights.resize(dim_);
  CopyWeightsOut(row, snap.weights.data());
  snap.state.assign(StateOf(row), StateOf(row) + state_floats_);
  snap.meta = *MetaOf(row);
  return snap;
}

void EmbeddingTable::ReadRows(absl::Span<const int64_t> ids, const RowFn& fn) const {
  for (const int64_t id : ids) {
    const uint64_t h = MapHash(id);
    Stripe& stripe = stripes_[h >> kStripeShift];
    absl::ReaderMutexLock lock(&stripe.mu);
    if (const float* row = stripe.Find(id, h)) fn(id, WeightsView(row), StateOf(row), *MetaOf(row));
  }
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
  const uint64_t h = MapHash(id);
  Stripe& stripe = stripes_[h >> kStripeShift];
  absl::MutexLock lock(&stripe.mu);
  float* row = stripe.Find(id, h);
  if (row == nullptr) {
    if (num_rows_.fetch_add(1, std::memory_order_relaxed) >= row_budget_ && row_budget_ > 0) {
      num_rows_.fetch_sub(1, std::memory_order_relaxed);
      return BudgetError();
    }
    // Not initialised: every field is written below.
    row = stripe.ReserveOne() ? stripe.AllocateRow(stride_floats_) : nullptr;
    if (row == nullptr) {
      num_rows_.fetch_sub(1, std::memory_order_relaxed);
      return OutOfMemoryError();
    }
    stripe.Place(id, h, row);
    ++stripe.size;
    *StoredMetaOf(row) = StoredMeta{};
  }
  StoreWeights(weights.data(), row);
  std::copy(state.begin(), state.end(), StateOf(row));
  StoredMetaOf(row)->meta = meta;
  if (mark_dirty && StoredMetaOf(row)->dirty == 0) MarkDirtyLocked(stripe, id, row);
  return absl::OkStatus();
}

void EmbeddingTable::Forget(int64_t id) {
  const uint64_t h = MapHash(id);
  Stripe& stripe = stripes_[h >> kStripeShift];
  absl::MutexLock lock(&stripe.mu);
  EraseLocked(stripe, id, h);
}

void EmbeddingTable::ForEachDirtyRow(const RowFn& fn) const {
  for (int s = 0; s < kNumStripes; ++s) {
    Stripe& stripe = stripes_[s];
    absl::ReaderMutexLock lock(&stripe.mu);
    for (const Stripe::Entry& e : stripe.dirty)
      fn(e.id, WeightsView(e.row), StateOf(e.row), *MetaOf(e.row));
  }
}

int64_t EmbeddingTable::DirtyRows() const {
  int64_t n = 0;
  for (int s = 0; s < kNumStripes; ++s) {
    absl::ReaderMutexLock lock(&stripes_[s].mu);
    n += static_cast<int64_t>(stripes_[s].dirty.size());
  }
  return n;
}

void EmbeddingTable::ClearDirty() {
  for (int s = 0; s < kNumStripes; ++s) {
    Stripe& stripe = stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    for (const Stripe::Entry& e : stripe.dirty) StoredMetaOf(e.row)->dirty = 0;
    stripe.dirty.clear();
  }
}

void EmbeddingTable::ForEachRow(const RowFn& fn) const {
  for (int s = 0; s < kNumStripes; ++s) {
    Stripe& stripe = stripes_[s];
    absl::ReaderMutexLock lock(&stripe.mu);
    for (const Stripe::Entry& e : stripe.entries) {
      if (e.row != nullptr) fn(e.id, WeightsView(e.row), StateOf(e.row), *MetaOf(e.row));
    }
  }
}

int64_t EmbeddingTable::MemoryBytes() const {
  int64_t bytes = 0;
  for (int s = 0; s < kNumStripes; ++s) {
    Stripe& stripe = stripes_[s];
    absl::ReaderMutexLock lock(&stripe.mu);
    bytes +=
        stripe.slab_bytes + static_cast<int64_t>(stripe.entries.size() * sizeof(Stripe::Entry));
  }
  return bytes;
}

void DisableMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace tessera::embedding
