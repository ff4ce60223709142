// Fixed-vocabulary tables: FixedRows' arrays and the EmbeddingTable operations over them.

// EmbeddingTable's fixed vocabulary: a row for every id of [0, vocabulary_size), laid out
// densely by id (FixedRows), looked up and updated without a map.
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "embedding/dtype.h"
#include "embedding/embedding_table.h"
#include "embedding/internal/admission.h"
#include "embedding/internal/fixed_rows.h"
#include "embedding/internal/row_initializer.h"
#include "embedding/internal/row_ops.h"
#include "embedding/internal/stripe.h"
#include "embedding/internal/stripe_plan.h"
#include "embedding/row_math.h"

namespace tessera::embedding {

using embedding_internal::AnyBits;
using embedding_internal::CopyFloats;
using embedding_internal::FixedRows;
using embedding_internal::PrefetchLines;
using embedding_internal::StripeWriter;

namespace {

constexpr int kFixedAhead = 32;      // rows prefetched ahead of the one updated
constexpr size_t kGatherAhead = 16;  // rows prefetched ahead of the one copied

}  // namespace

absl::Status EmbeddingTable::CheckIds(absl::Span<const int64_t> ids) const {
  if (fixed_ == nullptr) return absl::OkStatus();
  TESSERA_RETURN_IF_ERROR(CheckVocabulary(config_, ids));
  const FixedRows& f = *fixed_;
  if (f.part_count() == 1) return absl::OkStatus();
  for (const int64_t id : ids) {
    if (f.Holds(id)) continue;
    return absl::InvalidArgumentError(
        absl::StrCat("table '", name(), "': id ", id, " is not held here (this part holds the ids ",
                     f.part_index(), " modulo ", f.part_count(), ")"));
  }
  return absl::OkStatus();
}

EmbeddingTable::Stripe& EmbeddingTable::FixedStripe(int64_t row) const {
  return stripes_[FixedRows::StripeOf(row)];
}

void EmbeddingTable::ReadFixedRow(int64_t id, int64_t row, float* out) const {
  const FixedRows& f = *fixed_;
  CopyStoredWeights(f.Weights(row), out);
  // A row never stored is zero bytes (fresh pages; Forget zeroes them again), and a stored
  // row almost never is: only an all-zero row needs its live bit, which would otherwise
  // cost a second cache miss per id.
  if (f.ZeroBytes(row) && !f.Live(row)) InitialWeights(id, out);
}

// Rows [b, e) of a lookup while writers may be at work: a run of ids is copied out with
// each id's stripe sequence number noted, then checked; a row a writer changed meanwhile
// (or one that reads as zero bytes: never stored, or stored as zeros) is read again alone,
// under its stripe's lock.
void EmbeddingTable::FixedLookupGuarded(absl::Span<const int64_t> ids, size_t b, size_t e,
                                        float* out) const {
  const FixedRows& f = *fixed_;
  const size_t d = static_cast<size_t>(dim_);
  constexpr size_t kRun = 16;
  uint32_t seen[kRun];
  for (size_t c = b; c < e; c += kRun) {
    const size_t ce = std::min(e, c + kRun);
    for (size_t i = c; i < ce; ++i) {
      if (i + kGatherAhead < e) {
        PrefetchLines(f.Weights(f.RowOf(ids[i + kGatherAhead])), read_lines_, /*for_write=*/false);
      }
      const int64_t row = f.RowOf(ids[i]);
      seen[i - c] = stripes_[FixedRows::StripeOf(row)].ReadBegin();
      CopyStoredWeights(f.Weights(row), out + i * d);
    }
    for (size_t i = c; i < ce; ++i) {
      const int64_t row = f.RowOf(ids[i]);
      const Stripe& stripe = stripes_[FixedRows::StripeOf(row)];
      if (!(seen[i - c] & 1) && stripe.ReadValid(seen[i - c]) && !f.ZeroBytes(row)) continue;
      absl::ReaderMutexLock lock(&stripe.mu);
      ReadFixedRow(ids[i], row, out + i * d);
    }
  }
}

void EmbeddingTable::CopyStoredWeights(const float* stored, float* out) const {
  if (dtype_ == v1::FP32) {
    CopyFloats(out, stored, dim_);
  } else {
    DecodeWeights(dtype_, stored, dim_, out);
  }
}

absl::Status EmbeddingTable::FixedLookup(absl::Span<const int64_t> ids, float* out) const {
  TESSERA_RETURN_IF_ERROR(CheckIds(ids));
  const FixedRows& f = *fixed_;
  const size_t n = ids.size();
  const size_t d = static_cast<size_t>(dim_);
  // Chunks of ids are copied out in one plain loop (the copies overlap their cache misses,
  // rows prefetched ahead) when no writer was at work from the chunk's start to its end
  // (the common case: FixedRows::QuietBegin); else the chunk is read again guarded. Then
  // the chunk's copies, still in the L1 cache (chunks of at most 32 KiB), are scanned for
  // rows of zero bytes (never stored, or stored as zeros), which are read again alone.
  // (Noting zero rows in the copy loop itself cost a tenth of the gather's speed.)
  const size_t chunk = std::clamp<size_t>(8192 / d, 16, 512);
  for (size_t c = 0; c < n; c += chunk) {
    const size_t ce = std::min(n, c + chunk);
    const uint64_t quiet = f.QuietBegin();
    if (quiet == FixedRows::kNotQuiet) {
      FixedLookupGuarded(ids, c, ce, out);
      continue;
    }
    CopyFixedRows(ids, c, ce, out);
    if (!f.QuietEnd(quiet)) {
      FixedLookupGuarded(ids, c, ce, out);
      continue;
    }
    for (size_t i = c; i < ce; ++i) {
      // fp32 copies tell a zero row themselves; half-precision ones are decoded.
      if (dtype_ == v1::FP32 && AnyBits(out + i * d, dim_)) continue;
      const int64_t row = f.RowOf(ids[i]);
      if (dtype_ != v1::FP32 && !f.ZeroBytes(row)) continue;
      absl::ReaderMutexLock lock(&FixedStripe(row).mu);
      ReadFixedRow(ids[i], row, out + i * d);
    }
  }
  return absl::OkStatus();
}

namespace {

// The copy loop of a fixed-vocabulary lookup over ids [b, e) of `n` (fp32 weights, so a
// row's weights are `dim` floats), rows prefetched ahead. `one_part`: row = id.
template <bool one_part>
void CopyFp32Rows(const FixedRows& f, const int64_t* ids, size_t b, size_t e, size_t n, int dim,
                  int lines, float* out) {
  // Locals: the copy's vector stores may alias anything, which would reload members.
  const float* weights = f.Weights(0);
  const size_t d = static_cast<size_t>(dim);
  auto row_of = [&f](int64_t id) { return one_part ? id : f.RowOf(id); };
  for (size_t i = b; i < e; ++i) {
    if (i + kGatherAhead < n) {
      PrefetchLines(weights + static_cast<size_t>(row_of(ids[i + kGatherAhead])) * d, lines,
                    /*for_write=*/false);
    }
    CopyFloats(out + i * d, weights + static_cast<size_t>(row_of(ids[i])) * d, dim);
  }
}

}  // namespace

void EmbeddingTable::CopyFixedRows(absl::Span<const int64_t> ids, size_t b, size_t e,
                                   float* out) const {
  const FixedRows& f = *fixed_;
  if (dtype_ == v1::FP32) {
    if (f.part_count() == 1) {
      CopyFp32Rows<true>(f, ids.data(), b, e, ids.size(), dim_, read_lines_, out);
    } else {
      CopyFp32Rows<false>(f, ids.data(), b, e, ids.size(), dim_, read_lines_, out);
    }
    return;
  }
  for (size_t i = b; i < e; ++i) {
    if (i + kGatherAhead < ids.size()) {
      PrefetchLines(f.Weights(f.RowOf(ids[i + kGatherAhead])), read_lines_, /*for_write=*/false);
    }
    DecodeWeights(dtype_, f.Weights(f.RowOf(ids[i])), dim_, out + i * static_cast<size_t>(dim_));
  }
}

void EmbeddingTable::FixedInitLocked(int64_t id, int64_t row) {
  FixedRows& f = *fixed_;
  thread_local std::vector<float> w;
  w.resize(dim_);
  InitialWeights(id, w.data());
  StoreWeights(w.data(), f.Weights(row));
  optimizer().InitState(f.State(row));
  f.SetCount(row, 0);
  f.SetLive(row, true);
}

bool EmbeddingTable::FixedUpdateLocked(int64_t id, int64_t row, const float* grad, float* scratch) {
  FixedRows& f = *fixed_;
  float* w = scratch;         // (dim) half-precision weights as floats
  float* g = scratch + dim_;  // (dim) the gradient, when the optimizer must change it
  float* state = f.State(row);
  const uint32_t prior = f.Count(row);
  if (dtype_ == v1::FP32) {
    if (!optimizer().UpdateFinite(f.Weights(row), state, grad, g, prior)) return false;
  } else {
    DecodeWeights(dtype_, f.Weights(row), dim_, w);
    if (!optimizer().UpdateFinite(w, state, grad, g, prior)) return false;
    const uint64_t seed = row_math::UpdateRoundingSeed(initializer_->key(), id, prior);
    EncodeWeightsStochastic(dtype_, w, dim_, seed, f.Weights(row));
  }
  f.SetCount(row, prior + 1);
  f.MarkDirty(row);
  return true;
}

absl::Status EmbeddingTable::FixedApply(absl::Span<const int64_t> ids, const float* grads,
                                        int64_t) {
  TESSERA_RETURN_IF_ERROR(CheckIds(ids));
  FixedRows& f = *fixed_;
  const int lines = read_lines_;
  const int state_lines = (state_floats_ * 4 + 63) / 64;
  // The ids grouped by stripe (a counting sort, stable), so that each stripe's lock is
  // taken once per batch; rows are prefetched ahead along that order.
  thread_local std::vector<int64_t> rows;
  thread_local std::vector<int32_t> order;
  int32_t begin[kNumStripes + 1] = {};
  const size_t n = ids.size();
  rows.resize(n);
  order.resize(n);
  for (size_t i = 0; i < n; ++i) {
    rows[i] = f.RowOf(ids[i]);
    ++begin[FixedRows::StripeOf(rows[i]) + 1];
  }
  for (int s = 0; s < kNumStripes; ++s) begin[s + 1] += begin[s];
  int32_t cursor[kNumStripes];
  std::copy(begin, begin + kNumStripes, cursor);
  for (size_t i = 0; i < n; ++i)
    order[cursor[FixedRows::StripeOf(rows[i])]++] = static_cast<int32_t>(i);

  thread_local std::vector<float> scratch;
  scratch.resize(ScratchFloats());
  int64_t refused = 0, first_refused = 0, created = 0, not_admitted = 0;
  FixedRows::WriteScope writing(f);
  for (int s = 0; s < kNumStripes; ++s) {
    if (begin[s] == begin[s + 1]) continue;
    Stripe& stripe = stripes_[s];
    StripeWriter lock(stripe);
    stripe.BeginChange();
    for (int32_t k = begin[s]; k < begin[s + 1]; ++k) {
      if (static_cast<size_t>(k) + kFixedAhead < n) {
        const int64_t ahead = rows[order[k + kFixedAhead]];
        PrefetchLines(f.Weights(ahead), lines, /*for_write=*/true);
        if (state_lines > 0) PrefetchLines(f.State(ahead), state_lines, /*for_write=*/true);
      }
      const size_t i = static_cast<size_t>(order[k]);
      const int64_t id = ids[i];
      const int64_t row = rows[i];
      if (!f.Live(row)) {
        // The admission sketch's slice is the one of the stripe whose lock is held.
        const uint64_t h = (static_cast<uint64_t>(s) << embedding_internal::kStripeShift) |
                           (embedding_internal::MapHash(id) >> 6);
        if (admission_ != nullptr && !admission_->Count(id, h)) {
          ++not_admitted;
          continue;
        }
        FixedInitLocked(id, row);
        ++created;
      }
      if (!FixedUpdateLocked(id, row, grads + i * static_cast<size_t>(dim_), scratch.data()) &&
          refused++ == 0) {
        first_refused = id;
      }
    }
  }
  if (created > 0) AdjustRows(created);
  if (not_admitted > 0) refused_ids_.fetch_add(not_admitted, std::memory_order_relaxed);
  return refused == 0 ? absl::OkStatus() : NonFiniteUpdateError(refused, first_refused);
}

absl::Status EmbeddingTable::FixedPutRow(int64_t id, const float* weights, const float* state,
                                         const RowMeta& meta, bool mark_dirty) {
  TESSERA_RETURN_IF_ERROR(CheckIds({id}));
  FixedRows& f = *fixed_;
  const int64_t row = f.RowOf(id);
  FixedRows::WriteScope writing(f);
  Stripe& stripe = FixedStripe(row);
  StripeWriter lock(stripe);
  stripe.BeginChange();
  StoreWeights(weights, f.Weights(row));
  std::copy(state, state + state_floats_, f.State(row));
  f.SetCount(row, static_cast<uint32_t>(std::clamp<int64_t>(meta.update_count, 0, UINT32_MAX)));
  if (!f.Live(row)) {
    f.SetLive(row, true);
    AdjustRows(1);
  }
  if (mark_dirty) f.MarkDirty(row);
  return absl::OkStatus();
}

void EmbeddingTable::FixedForEach(const RowFn& fn, bool dirty_only) const {
  const FixedRows& f = *fixed_;
  for (int s = 0; s < kNumStripes; ++s) {
    absl::ReaderMutexLock lock(&stripes_[s].mu);
    for (int64_t w = s; w < f.words(); w += kNumStripes) {
      uint64_t bits = dirty_only ? f.DirtyWord(w) : f.LiveWord(w);
      while (bits != 0) {
        const int64_t row = w * 64 + __builtin_ctzll(bits);
        bits &= bits - 1;
        RowMeta meta;
        meta.update_count = f.Count(row);
        fn(f.IdOf(row), WeightsView(f.Weights(row)), f.State(row), meta);
      }
    }
  }
}

void EmbeddingTable::FixedForget(int64_t id) {
  FixedRows& f = *fixed_;
  if (!f.Holds(id)) return;
  const int64_t row = f.RowOf(id);
  FixedRows::WriteScope writing(f);
  Stripe& stripe = FixedStripe(row);
  StripeWriter lock(stripe);
  stripe.BeginChange();
  if (f.Live(row)) {
    f.SetLive(row, false);
    f.ZeroRow(row);  // what a row never stored reads as (ReadFixedRow)
    AdjustRows(-1);
  }
  f.MarkClean(row);
}

void EmbeddingTable::FixedClearDirty() {
  FixedRows& f = *fixed_;
  for (int s = 0; s < kNumStripes; ++s) {
    StripeWriter lock(stripes_[s]);
    for (int64_t w = s; w < f.words(); w += kNumStripes) f.ClearDirtyWord(w);
  }
}

}  // namespace tessera::embedding
