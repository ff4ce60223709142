#include "embedding/storage/row_codec.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/crc32c.h"

namespace tessera::storage {
namespace {

constexpr uint8_t kRowVersion = 1;
constexpr uint8_t kCatalogVersion = 1;
constexpr size_t kRowHeader = 4 + 4 + 4 + 8 + 8;

void PutBigEndian32(uint32_t v, std::string* out) {
  for (int s = 24; s >= 0; s -= 8) out->push_back(static_cast<char>((v >> s) & 0xff));
}

void PutBigEndian64(uint64_t v, std::string* out) {
  for (int s = 56; s >= 0; s -= 8) out->push_back(static_cast<char>((v >> s) & 0xff));
}

uint64_t GetBigEndian(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// The host is little-endian (x86-64, aarch64): values are copied as they lie in memory.
static_assert(std::endian::native == std::endian::little, "row values are little-endian");

template <typename T>
void PutRaw(const T& v, std::string* out) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
T GetRaw(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

std::string CatalogKey(uint32_t table_id) {
  std::string k = "C";
  PutBigEndian32(table_id, &k);
  return k;
}

std::string CatalogPrefix() { return "C"; }

std::string RowKey(uint32_t table_id, int64_t id) {
  std::string k = RowPrefix(table_id);
  PutBigEndian64(static_cast<uint64_t>(id), &k);
  return k;
}

std::string RowPrefix(uint32_t table_id) {
  std::string k = "R";
  PutBigEndian32(table_id, &k);
  return k;
}

std::string SpillKey(uint32_t table_id, int64_t id) {
  std::string k = SpillPrefix(table_id);
  PutBigEndian64(static_cast<uint64_t>(id), &k);
  return k;
}

std::string SpillPrefix(uint32_t table_id) {
  std::string k = "S";
  PutBigEndian32(table_id, &k);
  return k;
}

std::string MetaKey(absl::string_view name) { return absl::StrCat("M", name); }

std::string PushRecordKey(const embedding::PushTag& tag) {
  std::string k = PushRecordPrefix();
  PutBigEndian64(tag.request.client_id, &k);
  PutBigEndian64(tag.request.sequence, &k);
  PutBigEndian32(tag.part, &k);
  return k;
}

std::string PushRecordPrefix() { return "P"; }

bool ParsePushRecordKey(absl::string_view key, embedding::PushTag* tag) {
  if (key.size() != 21 || key[0] != 'P') return false;
  tag->request.client_id = GetBigEndian(key.data() + 1, 8);
  tag->request.sequence = GetBigEndian(key.data() + 9, 8);
  tag->part = static_cast<uint32_t>(GetBigEndian(key.data() + 17, 4));
  return true;
}

std::string EncodePushRecord(const PushRecordValue& record) {
  std::string v;
  PutBigEndian64(record.order, &v);
  PutBigEndian64(static_cast<uint64_t>(record.rows), &v);
  PutBigEndian64(record.map_version, &v);
  v.append(record.table);
  return v;
}

bool DecodePushRecord(absl::string_view value, PushRecordValue* record) {
  // 16 bytes: written before records named their map version and table.
  if (value.size() != 16 && value.size() < 24) return false;
  record->order = GetBigEndian(value.data(), 8);
  record->rows = static_cast<int64_t>(GetBigEndian(value.data() + 8, 8));
  record->map_version = value.size() >= 24 ? GetBigEndian(value.data() + 16, 8) : 0;
  record->table = value.size() > 24 ? std::string(value.substr(24)) : std::string();
  return true;
}

bool ParseRowKey(absl::string_view key, uint32_t* table_id, int64_t* id) {
  if (key.size() != 13 || (key[0] != 'R' && key[0] != 'S')) return false;
  *table_id = static_cast<uint32_t>(GetBigEndian(key.data() + 1, 4));
  *id = static_cast<int64_t>(GetBigEndian(key.data() + 5, 8));
  return true;
}

void EncodeRow(const float* weights, int dim, const float* state, int state_floats,
               const embedding::RowMeta& meta, std::string* out) {
  out->clear();
  out->reserve(kRowHeader + 4 * (dim + state_floats) + 4);
  out->push_back(static_cast<char>(kRowVersion));
  out->append(3, '\0');
  PutRaw(static_cast<uint32_t>(dim), out);
  PutRaw(static_cast<uint32_t>(state_floats), out);
  PutRaw(meta.last_step, out);
  PutRaw(meta.update_count, out);
  out->append(reinterpret_cast<const char*>(weights), sizeof(float) * dim);
  if (state_floats > 0) {
    out->append(reinterpret_cast<const char*>(state), sizeof(float) * state_floats);
  }
  PutRaw(base::Crc32c(out->data(), out->size()), out);
}

absl::Status DecodeRowInto(absl::string_view table, int64_t id, absl::string_view value, int dim,
                           int state_floats, float* weights, float* state,
                           embedding::RowMeta* meta) {
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat("table '", table, "': stored row ", id, " is corrupt: ", why));
  };
  if (value.size() < kRowHeader + 4) return bad(absl::StrCat("only ", value.size(), " bytes"));
  const uint32_t stored_crc = GetRaw<uint32_t>(value.data() + value.size() - 4);
  if (base::Crc32c(value.data(), value.size() - 4) != stored_crc) return bad("checksum mismatch");
  if (static_cast<uint8_t>(value[0]) != kRowVersion) {
    return bad(absl::StrCat("unknown format version ", static_cast<int>(value[0])));
  }
  const uint32_t d = GetRaw<uint32_t>(value.data() + 4);
  const uint32_t sf = GetRaw<uint32_t>(value.data() + 8);
  if (d != static_cast<uint32_t>(dim) || sf != static_cast<uint32_t>(state_floats)) {
    return bad(absl::StrCat("stored with dim ", d, " and ", sf, " state floats, the table has dim ",
                            dim, " and ", state_floats));
  }
  if (value.size() != kRowHeader + 4 * (static_cast<size_t>(d) + sf) + 4) {
    return bad(absl::StrCat("length ", value.size(), " does not match its shape"));
  }
  meta->last_step = GetRaw<int64_t>(value.data() + 12);
  meta->update_count = GetRaw<int64_t>(value.data() + 20);
  const char* p = value.data() + kRowHeader;
  std::memcpy(weights, p, 4 * d);
  // SGD rows have no state: no copy (memcpy to a null pointer is undefined).
  if (sf > 0) std::memcpy(state, p + 4 * d, 4 * sf);
  return absl::OkStatus();
}

absl::Status DecodeRow(absl::string_view table, int64_t id, absl::string_view value, int dim,
                       int state_floats, DecodedRow* row) {
  row->weights.resize(static_cast<size_t>(std::max(dim, 0)));
  row->state.resize(static_cast<size_t>(std::max(state_floats, 0)));
  return DecodeRowInto(table, id, value, dim, state_floats, row->weights.data(), row->state.data(),
                       &row->meta);
}

std::string EncodeCatalogEntry(const v1::TableConfig& config) {
  std::string out(1, static_cast<char>(kCatalogVersion));
  config.AppendToString(&out);
  PutRaw(base::Crc32c(out.data(), out.size()), &out);
  return out;
}

absl::StatusOr<v1::TableConfig> DecodeCatalogEntry(uint32_t table_id, absl::string_view value) {
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat("catalog entry of table id ", table_id, " is corrupt: ", why));
  };
  if (value.size() < 5) return bad("truncated");
  if (base::Crc32c(value.data(), value.size() - 4) !=
      GetRaw<uint32_t>(value.data() + value.size() - 4)) {
    return bad("checksum mismatch");
  }
  if (static_cast<uint8_t>(value[0]) != kCatalogVersion) return bad("unknown format version");
  v1::TableConfig config;
  if (!config.ParseFromArray(value.data() + 1, static_cast<int>(value.size() - 5))) {
    return bad("config does not parse");
  }
  return config;
}

}  // namespace tessera::storage
