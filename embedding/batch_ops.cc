#include "embedding/batch_ops.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/status.h"
#include "embedding/row_math.h"
#include "embedding/sharding.h"

namespace tessera::embedding {
row_math::PoolingKind PoolingKindOf(v1::Pooling pooling) {
  switch (pooling) {
    case v1::MEAN:
      return row_math::PoolingKind::kMean;
    case v1::SQRTN:
      return row_math::PoolingKind::kSqrtN;
    default:
      return row_math::PoolingKind::kSum;
  }
}

namespace {

// Per-thread open-addressing map from id to its unique index. A slot keeps key, index
// and a generation stamp together (one cache line access per probe); slots from an
// older call are stale by stamp, so a call clears nothing.
struct DedupSlot {
  int64_t key;
  int32_t value;
  uint32_t stamp;
};

struct DedupScratch {
  std::vector<DedupSlot> slots;
  uint32_t generation = 0;
};

float BagScale(v1::Pooling pooling, int32_t begin, int32_t end) {
  return row_math::BagScale(PoolingKindOf(pooling), end - begin);
}

// Unweighted sum pooling with the dimension known at compile time: the row loop becomes a
// few vector adds. Sums in the same order as the general loop (0, then each id's row), so
// the results are the same bits.
template <int kDim>
void SumBags(const float* __restrict rows, const int32_t* inverse, const int32_t* offsets,
             size_t bags, float* __restrict out) {
  for (size_t b = 0; b < bags; ++b) {
    float acc[kDim] = {};
    for (int32_t k = offsets[b]; k < offsets[b + 1]; ++k) {
      const float* src = rows + static_cast<size_t>(inverse[k]) * kDim;
      for (int j = 0; j < kDim; ++j) acc[j] += src[j];
    }
    std::copy_n(acc, kDim, out + b * kDim);
  }
}

// Calls fn.template operator()<kDim>() for the common dimensions; false for others.
template <typename Fn>
bool WithFixedDim(int dim, Fn&& fn) {
  switch (dim) {
    case 8: fn.template operator()<8>(); return true;
    case 16: fn.template operator()<16>(); return true;
    case 32: fn.template operator()<32>(); return true;
    case 64: fn.template operator()<64>(); return true;
    case 128: fn.template operator()<128>(); return true;
    default: return false;
  }
}

}  // namespace

void Unique(absl::Span<const int64_t> ids, std::vector<int64_t>* unique_ids,
            std::vector<int32_t>* inverse) {
  thread_local DedupScratch s;
  const size_t n = ids.size();
  unique_ids->clear();
  inverse->resize(n);
  if (n == 0) return;
  const size_t cap = std::bit_ceil(std::max<size_t>(16, 2 * n));
  if (s.slots.size() < cap) {
    s.slots.assign(cap, DedupSlot{0, 0, 0});
    s.generation = 0;
  }
  if (++s.generation == 0) {  // wrapped: clear stamps once every 2^32 calls
    for (DedupSlot& slot : s.slots) slot.stamp = 0;
    s.generation = 1;
  }
  const uint64_t mask = cap - 1;
  const uint32_t gen = s.generation;
  DedupSlot* slots = s.slots.data();
  unique_ids->reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t id = ids[i];
    uint64_t pos = Mix64(static_cast<uint64_t>(id)) & mask;
    while (true) {
      DedupSlot& slot = slots[pos];
      if (slot.stamp != gen) {
        slot = DedupSlot{id, static_cast<int32_t>(unique_ids->size()), gen};
        (*inverse)[i] = slot.value;
        unique_ids->push_back(id);
        break;
      }
      if (slot.key == id) {
        (*inverse)[i] = slot.value;
        break;
      }
      pos = (pos + 1) & mask;
    }
  }
}

uint64_t IdsFingerprint(absl::Span<const int64_t> ids) {
  // Each id mixed with its position, the results summed: the terms do not wait on each
  // other, and a change in any id or its place changes the sum.
  uint64_t sum = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    sum +=
        Mix64(static_cast<uint64_t>(ids[i]) ^ (static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ULL));
  }
  return Mix64(sum ^ ids.size());
}

void SumRowsByInverse(const float* rows, int dim, absl::Span<const int32_t> inverse, float* out) {
  for (size_t i = 0; i < inverse.size(); ++i) {
    float* dst = out + static_cast<size_t>(inverse[i]) * dim;
    const float* src = rows + i * dim;
    for (int j = 0; j < dim; ++j) dst[j] += src[j];
  }
}

absl::Status CheckRowsSize(absl::string_view table, absl::string_view what, size_t size,
                           size_t rows, int dim, absl::string_view unit) {
  if (size == rows * dim) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("table '", table, "': dimension mismatch: ", what,
                                                 " has ", size, " floats, expected ", rows * dim,
                                                 " (", rows, " ", unit, " x dim ", dim, ")"));
}

absl::Status CheckFiniteGradients(absl::string_view table, absl::Span<const int64_t> ids,
                                  const float* gradients, int dim) {
  const size_t n = ids.size() * dim;
  // Blocks scanned branch-free on the exponent bits (all ones: Inf or NaN), so the loop
  // vectorises; only a block with a bad value is searched for it.
  constexpr size_t kBlock = 1024;
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t end = std::min(n, begin + kBlock);
    uint32_t bad = 0;
    for (size_t i = begin; i < end; ++i) {
      bad |= (std::bit_cast<uint32_t>(gradients[i]) & 0x7f800000u) == 0x7f800000u;
    }
    if (bad == 0) continue;
    for (size_t i = begin; i < end; ++i) {
      if (!std::isfinite(gradients[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("table '", table, "': gradient for id ", ids[i / dim], " (position ",
                         i / dim, ", column ", i % dim, ") is ", gradients[i], "; batch rejected"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckedPush> CheckPush(absl::Span<const v1::TableConfig> configs,
                                      absl::Span<const TableGradients> parts) {
  TESSERA_DCHECK(configs.size() == parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    const TableGradients& p = parts[i];
    const int dim = configs[i].dim();
    TESSERA_RETURN_IF_ERROR(
        CheckRowsSize(p.table, "gradients", p.gradients.size(), p.ids.size(), dim, "ids"));
    TESSERA_RETURN_IF_ERROR(CheckFiniteGradients(p.table, p.ids, p.gradients.data(), dim));
  }
  return CheckedPush(configs, parts);
}

absl::Status SumGradients(absl::string_view table, absl::Span<const int64_t> ids,
                          absl::Span<const float> gradients, int dim, SummedGradients* out,
                          Gradients given) {
  if (given == Gradients::kUnchecked) {
    TESSERA_RETURN_IF_ERROR(
        CheckRowsSize(table, "gradients", gradients.size(), ids.size(), dim, "ids"));
  }
  TESSERA_DCHECK(gradients.size() == ids.size() * dim);
  out->dim_ = dim;
  Unique(ids, &out->ids_, &out->inverse_);
  const bool repeated = out->ids_.size() < ids.size();
  if (repeated) {
    out->rows_.assign(out->ids_.size() * dim, 0.0f);
    SumRowsByInverse(gradients.data(), dim, out->inverse_, out->rows_.data());
  } else {
    // Distinct ids (a client's deduplicated push): each sum is its one gradient, added to
    // 0 as the sum above adds it (a -0 comes out +0), in one pass instead of two.
    out->rows_.resize(gradients.size());
    float* const rows = out->rows_.data();
    for (size_t i = 0; i < gradients.size(); ++i) rows[i] = 0.0f + gradients[i];
  }
  // Checked gradients of distinct ids are their own sums, already found finite.
  if (given == Gradients::kChecked && !repeated) return absl::OkStatus();
  absl::Status finite = CheckFiniteGradients(table, out->ids_, out->rows_.data(), dim);
  if (finite.ok() || !repeated) return finite;
  // A bad sum of repeated ids: name the gradient sent when one was bad; finite gradients
  // can sum to Inf too, and then say so, or the caller looks for a bad gradient it did not
  // send.
  if (given == Gradients::kUnchecked) {
    TESSERA_RETURN_IF_ERROR(CheckFiniteGradients(table, ids, gradients.data(), dim));
  }
  return Annotate(finite, "summed over repeated ids");
}

absl::Status CheckFiniteWeights(absl::string_view where, absl::Span<const float> weights) {
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!std::isfinite(weights[i])) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": weight ", i, " is ", weights[i]));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateBags(size_t num_ids, absl::Span<const int32_t> offsets, size_t num_weights) {
  if (offsets.empty()) {
    return absl::InvalidArgumentError("offsets must have bags+1 entries, got none");
  }
  if (offsets[0] != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("offsets must start at 0, got offsets[0] = ", offsets[0]));
  }
  for (size_t b = 1; b < offsets.size(); ++b) {
    if (offsets[b] < offsets[b - 1]) {
      return absl::InvalidArgumentError(absl::StrCat("offsets not monotone: offsets[", b,
                                                     "] = ", offsets[b], " < offsets[", b - 1,
                                                     "] = ", offsets[b - 1]));
    }
  }
  if (static_cast<size_t>(offsets.back()) != num_ids) {
    return absl::InvalidArgumentError(absl::StrCat(
        "offsets out of range: last offset ", offsets.back(), " but there are ", num_ids, " ids"));
  }
  if (num_weights != 0 && num_weights != num_ids) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights has ", num_weights, " entries; expected 0 or one per id (", num_ids, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> CheckLookupShape(absl::string_view where, size_t num_ids,
                                        absl::Span<const int32_t> offsets,
                                        absl::Span<const float> weights) {
  if (offsets.empty()) {
    if (!weights.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": weights need bag offsets"));
    }
    return num_ids;
  }
  absl::Status bags = ValidateBags(num_ids, offsets, weights.size());
  if (!bags.ok()) return absl::Status(bags.code(), absl::StrCat(where, ": ", bags.message()));
  TESSERA_RETURN_IF_ERROR(CheckFiniteWeights(where, weights));
  return offsets.size() - 1;
}

void PoolBags(const float* rows, int dim, absl::Span<const int32_t> inverse,
              absl::Span<const int32_t> offsets, absl::Span<const float> weights,
              v1::Pooling pooling, float* out) {
  const size_t bags = offsets.size() - 1;
  if (weights.empty() && pooling == v1::SUM &&
      WithFixedDim(dim, [&]<int kDim>() {
        SumBags<kDim>(rows, inverse.data(), offsets.data(), bags, out);
      })) {
    return;
  }
  for (size_t b = 0; b < bags; ++b) {
    float* dst = out + b * dim;
    std::fill(dst, dst + dim, 0.0f);
    const int32_t begin = offsets[b];
    const int32_t end = offsets[b + 1];
    for (int32_t k = begin; k < end; ++k) {
      const float* src = rows + static_cast<size_t>(inverse[k]) * dim;
      const float w = weights.empty() ? 1.0f : weights[k];
      for (int j = 0; j < dim; ++j) dst[j] += w * src[j];
    }
    const float scale = BagScale(pooling, begin, end);
    if (scale != 1.0f) {
      for (int j = 0; j < dim; ++j) dst[j] *= scale;
    }
  }
}

void RowsToAnswer(const float* rows, int dim, absl::Span<const int32_t> row_of_ids,
                  absl::Span<const int32_t> offsets, absl::Span<const float> weights,
                  v1::Pooling pooling, float* out) {
  if (!offsets.empty()) {
    PoolBags(rows, dim, row_of_ids, offsets, weights, pooling, out);
    return;
  }
  for (size_t i = 0; i < row_of_ids.size(); ++i) {
    std::copy_n(rows + static_cast<size_t>(row_of_ids[i]) * dim, dim, out + i * dim);
  }
}

void AddPartialBags(absl::Span<const char* const> partials, int dim,
                    absl::Span<const int32_t> offsets, v1::Pooling pooling, float* out) {
  const size_t bags = offsets.size() - 1;
  const size_t n = bags * dim;
  std::fill(out, out + n, 0.0f);
  std::vector<float> partial(n);
  for (const char* values : partials) {
    std::memcpy(partial.data(), values, n * sizeof(float));
    for (size_t j = 0; j < n; ++j) out[j] += partial[j];
  }
  if (pooling == v1::MEAN) {
    for (size_t b = 0; b < bags; ++b) {
      const int count = offsets[b + 1] - offsets[b];
      if (count == 0) continue;
      for (int j = 0; j < dim; ++j) out[b * dim + j] /= static_cast<float>(count);
    }
  } else if (pooling == v1::SQRTN) {
    // As the in-process pooling scales: by row_math::BagScale.
    for (size_t b = 0; b < bags; ++b) {
      const float scale =
          row_math::BagScale(row_math::PoolingKind::kSqrtN, offsets[b + 1] - offsets[b]);
      for (int j = 0; j < dim; ++j) out[b * dim + j] *= scale;
    }
  }
}

void PoolBagsBackward(const float* bag_grads, int dim, absl::Span<const int32_t> inverse,
                      absl::Span<const int32_t> offsets, absl::Span<const float> weights,
                      v1::Pooling pooling, size_t num_unique, float* unique_grads) {
  std::fill(unique_grads, unique_grads + num_unique * dim, 0.0f);
  const size_t bags = offsets.size() - 1;
  for (size_t b = 0; b < bags; ++b) {
    const float* g = bag_grads + b * dim;
    const int32_t begin = offsets[b];
    const int32_t end = offsets[b + 1];
    const float scale = BagScale(pooling, begin, end);
    for (int32_t k = begin; k < end; ++k) {
      float* dst = unique_grads + static_cast<size_t>(inverse[k]) * dim;
      const float w = (weights.empty() ? 1.0f : weights[k]) * scale;
      for (int j = 0; j < dim; ++j) dst[j] += w * g[j];
    }
  }
}

absl::Status CheckRowBlock(absl::string_view table, int dim, int state_floats,
                           const RowBlock& rows) {
  const std::string where = absl::StrCat("table '", table, "'");
  const size_t n = rows.ids.size();
  if (rows.dim != dim) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": rows of dim ", rows.dim, ", the table's is ", dim));
  }
  if (rows.weights.size() != n * dim) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", rows.weights.size(),
                                                   " weights for ", n, " rows of dim ", dim));
  }
  if (!rows.state.empty() &&
      (rows.state_floats != state_floats || rows.state.size() != n * state_floats)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": optimizer state of ", rows.state_floats, " floats a row (", rows.state.size(),
        " in all), the table's optimizer keeps ", state_floats, " a row"));
  }
  if ((!rows.last_steps.empty() && rows.last_steps.size() != n) ||
      (!rows.update_counts.empty() && rows.update_counts.size() != n)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": last steps and update counts must be empty or one per row"));
  }
  for (const std::vector<float>* values : {&rows.weights, &rows.state}) {
    for (size_t i = 0; i < values->size(); ++i) {
      if (!std::isfinite((*values)[i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": row ", rows.ids[i / (values == &rows.weights ? dim : state_floats)],
            values == &rows.weights ? " has a non-finite weight" : " has non-finite state"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::embedding
