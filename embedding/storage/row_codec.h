#ifndef TESSERA_EMBEDDING_STORAGE_ROW_CODEC_H_
#define TESSERA_EMBEDDING_STORAGE_ROW_CODEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "embedding/collection.h"
#include "embedding/embedding_table.h"
#include "tessera/v1/config.pb.h"

namespace tessera::storage {

// Keys: one byte of kind, then big-endian fields, so a table's rows sort together and
// a prefix scan reads one table.
//   catalog entry: 'C' | table id (u32)            -> table config
//   row:           'R' | table id (u32) | id (u64) -> row value
//   spilled row:   'S' | table id (u32) | id (u64) -> row value: a row of a CHECKPOINT
//                  table evicted since the last checkpoint (moved to 'R' at the next)
//   store meta:    'M' | name                      -> store-level values
//   push record:   'P' | client id (u64) | sequence (u64) | part (u32)
//                  -> order (u64) | rows updated (u64) | map version (u64) | table name:
//                  a write-through push part applied (16 bytes: from before the version
//                  and table were recorded)
std::string CatalogKey(uint32_t table_id);
std::string CatalogPrefix();
std::string RowKey(uint32_t table_id, int64_t id);
std::string RowPrefix(uint32_t table_id);
std::string SpillKey(uint32_t table_id, int64_t id);
std::string SpillPrefix(uint32_t table_id);
std::string MetaKey(absl::string_view name);
std::string PushRecordKey(const embedding::PushTag& tag);
std::string PushRecordPrefix();
// The tag of a push record key; false when `key` is not one.
bool ParsePushRecordKey(absl::string_view key, embedding::PushTag* tag);
// A push record's value: the order it was written in, the rows the part updated, the
// shard map version it was applied under (0: not recorded) and its table ("": not
// recorded).
struct PushRecordValue {
  uint64_t order = 0;
  int64_t rows = 0;
  uint64_t map_version = 0;
  std::string table;
};
std::string EncodePushRecord(const PushRecordValue& record);
bool DecodePushRecord(absl::string_view value, PushRecordValue* record);
// The table id and row id of a row (or spilled row) key; false when `key` is not one.
bool ParseRowKey(absl::string_view key, uint32_t* table_id, int64_t* id);

// Row value, little-endian: format version (u8 = 1), 3 zero bytes, dim (u32), state
// floats (u32), last_step (i64), update_count (i64), weights (f32 x dim), state (f32 x
// state floats), then the CRC-32C of everything before it (u32).
void EncodeRow(const float* weights, int dim, const float* state, int state_floats,
               const embedding::RowMeta& meta, std::string* out);

// A decoded row.
struct DecodedRow {
  std::vector<float> weights;
  std::vector<float> state;
  embedding::RowMeta meta;
};

// Decodes and checks a row value of table `table`: DataLoss naming the table and row for
// a bad checksum, an unknown version, a truncated value or shapes that do not match the
// table's (`dim`, `state_floats`).
absl::Status DecodeRow(absl::string_view table, int64_t id, absl::string_view value, int dim,
                       int state_floats, DecodedRow* row);

// DecodeRow into caller buffers: `weights` (dim), `state` (state_floats), `meta`.
absl::Status DecodeRowInto(absl::string_view table, int64_t id, absl::string_view value, int dim,
                           int state_floats, float* weights, float* state,
                           embedding::RowMeta* meta);

// A catalog value: format version (u8 = 1), the serialized TableConfig, CRC-32C (u32).
std::string EncodeCatalogEntry(const v1::TableConfig& config);
absl::StatusOr<v1::TableConfig> DecodeCatalogEntry(uint32_t table_id, absl::string_view value);

}  // namespace tessera::storage

#endif  // TESSERA_EMBEDDING_STORAGE_ROW_CODEC_H_
