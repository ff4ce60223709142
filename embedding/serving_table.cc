#include "embedding/serving_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "embedding/internal/row_initializer.h"
#include "embedding/row_math.h"
#include "embedding/sharding.h"

namespace tessera::embedding {

namespace {

constexpr int kMaxDim = 65536;

// The smallest and largest element of `row`.
std::pair<float, float> RangeOf(const float* row, int dim) {
  float lo = row[0], hi = row[0];
  for (int j = 1; j < dim; ++j) {
    lo = std::min(lo, row[j]);
    hi = std::max(hi, row[j]);
  }
  return {lo, hi};
}

void EncodeFp32(const float* row, int dim, uint8_t* out) {
  std::memcpy(out, row, sizeof(float) * dim);
}
void DecodeFp32(const uint8_t* in, int dim, float* out) {
  std::memcpy(out, in, sizeof(float) * dim);
}

void EncodeFp16(const float* row, int dim, uint8_t* out) {
  for (int j = 0; j < dim; ++j) {
    const uint16_t h = row_math::HalfNearest(row[j]);
    std::memcpy(out + 2 * j, &h, sizeof(h));
  }
}
void DecodeFp16(const uint8_t* in, int dim, float* out) {
  for (int j = 0; j < dim; ++j) {
    uint16_t h;
    std::memcpy(&h, in + 2 * j, sizeof(h));
    out[j] = row_math::HalfToFloat(h);
  }
}

void EncodeInt8(const float* row, int dim, uint8_t* out) {
  const auto [lo, hi] = RangeOf(row, dim);
  const float scale = (hi - lo) / 255.0f;
  const float inverse = scale > 0 ? 1.0f / scale : 0.0f;
  for (int j = 0; j < dim; ++j) {
    const float level = std::nearbyint((row[j] - lo) * inverse);
    out[j] = static_cast<uint8_t>(std::clamp(level, 0.0f, 255.0f));
  }
  std::memcpy(out + dim, &scale, sizeof(float));
  std::memcpy(out + dim + sizeof(float), &lo, sizeof(float));
}
void DecodeInt8(const uint8_t* in, int dim, float* out) {
  float scale, bias;
  std::memcpy(&scale, in + dim, sizeof(float));
  std::memcpy(&bias, in + dim + sizeof(float), sizeof(float));
  for (int j = 0; j < dim; ++j) out[j] = scale * static_cast<float>(in[j]) + bias;
}

// Each format's name, the bytes of a row (per element, and per row), and its coding; in
// the order of ServingFormat.
struct Codec {
  ServingFormat format;
  const char* name;
  size_t element_bytes;
  size_t row_bytes;
  void (*encode)(const float* row, int dim, uint8_t* out);
  void (*decode)(const uint8_t* in, int dim, float* out);
};
constexpr Codec kCodecs[] = {
    {ServingFormat::kFp32, "fp32", sizeof(float), 0, EncodeFp32, DecodeFp32},
    {ServingFormat::kFp16, "fp16", sizeof(uint16_t), 0, EncodeFp16, DecodeFp16},
    {ServingFormat::kInt8, "int8", 1, 2 * sizeof(float), EncodeInt8, DecodeInt8},
};
const Codec& CodecOf(ServingFormat format) { return kCodecs[static_cast<int>(format)]; }

}  // namespace

absl::StatusOr<ServingFormat> ParseServingFormat(absl::string_view name) {
  for (const Codec& c : kCodecs) {
    if (name == c.name) return c.format;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown serving format '", name, "': fp32, fp16 or int8"));
}

std::string ServingFormatName(ServingFormat format) { return CodecOf(format).name; }

size_t ServingRowBytes(ServingFormat format, int dim) {
  const Codec& c = CodecOf(format);
  return c.element_bytes * dim + c.row_bytes;
}

void EncodeServingRow(ServingFormat format, const float* row, int dim, uint8_t* out) {
  CodecOf(format).encode(row, dim, out);
}

void DecodeServingRow(ServingFormat format, const uint8_t* in, int dim, float* out) {
  CodecOf(format).decode(in, dim, out);
}

float ServingRowErrorBound(ServingFormat format, const float* row, int dim) {
  if (format == ServingFormat::kFp32 || dim == 0) return 0.0f;
  const auto [lo, hi] = RangeOf(row, dim);
  const float largest = std::max(std::fabs(lo), std::fabs(hi));
  if (format == ServingFormat::kFp16) {
    if (largest > row_math::kHalfMax) return largest - row_math::kHalfMax;
    return std::max(largest * 0x1p-11f, 0x1p-25f);
  }
  // Half a level, and the rounding of (x - lo) / scale and of scale * q + bias: a few
  // units in the last place of the largest magnitude involved.
  return (hi - lo) / 510.0f + 4.0f * std::numeric_limits<float>::epsilon() * (largest + (hi - lo));
}

absl::StatusOr<std::unique_ptr<ServingTable>> ServingTable::Create(const v1::TableConfig& config,
                                                                   ServingFormat format) {
  if (config.name().empty()) return absl::InvalidArgumentError("serving table: no name");
  if (config.dim() < 1 || config.dim() > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat("serving table '", config.name(), "': dim ",
                                                   config.dim(), " is not in [1, ", kMaxDim, "]"));
  }
  return std::unique_ptr<ServingTable>(new ServingTable(config, format));
}

ServingTable::ServingTable(const v1::TableConfig& config, ServingFormat format)
    : config_(config),
      format_(format),
      record_bytes_(sizeof(int64_t) + ServingRowBytes(format, config.dim())),
      initializer_(std::make_unique<embedding_internal::RowInitializer>(config)),
      index_(16, kEmpty) {}

ServingTable::~ServingTable() = default;

absl::Status ServingTable::CheckIds(absl::Span<const int64_t> ids) const {
  return Annotate(CheckVocabulary(config_, ids),
                  absl::StrCat("serving table '", config_.name(), "'"));
}

uint8_t* ServingTable::Record(uint32_t slot) const {
  return blocks_[slot / kBlockRows].get() + (slot % kBlockRows) * record_bytes_;
}

uint32_t ServingTable::Find(int64_t id) const {
  const size_t mask = index_.size() - 1;
  for (size_t i = row_math::Mix(static_cast<uint64_t>(id)) & mask;; i = (i + 1) & mask) {
    const uint32_t slot = index_[i];
    if (slot == kEmpty) return kEmpty;
    int64_t at;
    std::memcpy(&at, Record(slot), sizeof(at));
    if (at == id) return slot;
  }
}

void ServingTable::GrowIndex() {
  std::vector<uint32_t> grown(index_.size() * 2, kEmpty);
  const size_t mask = grown.size() - 1;
  for (uint32_t slot = 0; slot < used_; ++slot) {
    int64_t id;
    std::memcpy(&id, Record(slot), sizeof(id));
    size_t i = row_math::Mix(static_cast<uint64_t>(id)) & mask;
    while (grown[i] != kEmpty) i = (i + 1) & mask;
    grown[i] = slot;
  }
  index_.swap(grown);
}

uint32_t ServingTable::FindOrAdd(int64_t id) {
  if (const uint32_t slot = Find(id); slot != kEmpty) return slot;
  if (4 * (static_cast<size_t>(used_) + 1) > 3 * index_.size()) GrowIndex();
  const uint32_t slot = used_++;
  if (slot / kBlockRows >= blocks_.size()) {
    blocks_.push_back(std::make_unique<uint8_t[]>(kBlockRows * record_bytes_));
  }
  std::memcpy(Record(slot), &id, sizeof(id));
  const size_t mask = index_.size() - 1;
  size_t i = row_math::Mix(static_cast<uint64_t>(id)) & mask;
  while (index_[i] != kEmpty) i = (i + 1) & mask;
  index_[i] = slot;
  return slot;
}

absl::Status ServingTable::Apply(absl::Span<const int64_t> ids, absl::Span<const float> weights) {
  const int dim = config_.dim();
  if (weights.size() != ids.size() * dim) {
    return absl::InvalidArgumentError(absl::StrCat("serving table '", config_.name(),
                                                   "': ", weights.size(), " weights for ",
                                                   ids.size(), " ids of dim ", dim));
  }
  TESSERA_RETURN_IF_ERROR(CheckIds(ids));
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!std::isfinite(weights[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "serving table '", config_.name(), "': row of id ", ids[i / dim], " holds ", weights[i]));
    }
  }
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < ids.size(); ++i) {
    EncodeServingRow(format_, weights.data() + i * dim, dim,
                     Record(FindOrAdd(ids[i])) + sizeof(int64_t));
  }
  return absl::OkStatus();
}

absl::Status ServingTable::ResetRows(absl::Span<const int64_t> ids) {
  TESSERA_RETURN_IF_ERROR(CheckIds(ids));
  std::vector<float> row(config_.dim());
  absl::MutexLock lock(&mu_);
  for (const int64_t id : ids) {
    const uint32_t slot = Find(id);
    if (slot == kEmpty) continue;
    initializer_->InitialWeights(id, row.data());
    EncodeServingRow(format_, row.data(), config_.dim(), Record(slot) + sizeof(int64_t));
  }
  return absl::OkStatus();
}

std::vector<int64_t> ServingTable::Ids() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<int64_t> ids(used_);
  for (uint32_t slot = 0; slot < used_; ++slot) {
    std::memcpy(&ids[slot], Record(slot), sizeof(int64_t));
  }
  return ids;
}

absl::Status ServingTable::ForEachRecords(
    const std::function<absl::Status(const uint8_t* records, int64_t count)>& sink) const {
  absl::ReaderMutexLock lock(&mu_);
  for (int64_t at = 0; at < used_; at += kBlockRows) {
    TESSERA_RETURN_IF_ERROR(
        sink(blocks_[at / kBlockRows].get(), std::min<int64_t>(kBlockRows, used_ - at)));
  }
  return absl::OkStatus();
}

absl::Status ServingTable::LoadRecords(const uint8_t* records, int64_t count) {
  std::vector<int64_t> ids(count);
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(&ids[i], records + i * record_bytes_, sizeof(int64_t));
  }
  TESSERA_RETURN_IF_ERROR(CheckIds(ids));
  absl::MutexLock lock(&mu_);
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(Record(FindOrAdd(ids[i])), records + i * record_bytes_, record_bytes_);
  }
  return absl::OkStatus();
}

absl::Status ServingTable::Lookup(absl::Span<const int64_t> ids, absl::Span<float> out) const {
  const int dim = config_.dim();
  if (out.size() != ids.size() * dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("serving table '", config_.name(), "': room for ", out.size(), " values, ",
                     ids.size(), " ids of dim ", dim, " need ", ids.size() * dim));
  }
  TESSERA_RETURN_IF_ERROR(CheckIds(ids));
  absl::ReaderMutexLock lock(&mu_);
  for (size_t i = 0; i < ids.size(); ++i) {
    float* row = out.data() + i * dim;
    const uint32_t slot = Find(ids[i]);
    if (slot == kEmpty) {
      initializer_->InitialWeights(ids[i], row);
    } else {
      DecodeServingRow(format_, Record(slot) + sizeof(int64_t), dim, row);
    }
  }
  return absl::OkStatus();
}

int64_t ServingTable::rows() const {
  absl::ReaderMutexLock lock(&mu_);
  return used_;
}

int64_t ServingTable::memory_bytes() const {
  absl::ReaderMutexLock lock(&mu_);
  return static_cast<int64_t>(index_.capacity() * sizeof(uint32_t) +
                              blocks_.size() * kBlockRows * record_bytes_ +
                              blocks_.capacity() * sizeof(blocks_[0]));
}

}  // namespace tessera::embedding
