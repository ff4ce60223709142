#include "embedding/storage/internal/durable_store.h"

#include "base/status.h"
#include "embedding/storage/row_codec.h"

namespace tessera::storage_internal {

using storage::CatalogPrefix;
using storage::DecodeCatalogEntry;
using storage::KvStore;
using storage::KvStoreFactory;
using storage::KvStoreOptions;
using storage::KvWrite;
using storage::ParseRowKey;
using storage::RowKey;
using storage::RowPrefix;

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

embedding::CheckpointInfo InfoOf(const storage::CheckpointManifest& m) {
  return {.model = m.model,
          .step = m.step,
          .rows = m.rows,
          .bytes = m.bytes,
          .created_unix_ms = m.created_unix_ms,
          .seconds = 0,   // the call that took or restored it times itself
          .shards = {}};  // one place's: no shard servers
}

absl::StatusOr<std::vector<std::pair<uint32_t, v1::TableConfig>>> ReadCatalog(
    const KvStore& store) {
  std::vector<std::pair<uint32_t, v1::TableConfig>> catalog;
  TESSERA_RETURN_IF_ERROR(Annotate(
      store.Scan(CatalogPrefix(),
                 [&](absl::string_view key, absl::string_view value) {
                   if (key.size() != 5)
                     return absl::DataLossError("malformed catalog key in the store");
                   const uint32_t id =
                       (static_cast<uint32_t>(static_cast<unsigned char>(key[1])) << 24) |
                       (static_cast<uint32_t>(static_cast<unsigned char>(key[2])) << 16) |
                       (static_cast<uint32_t>(static_cast<unsigned char>(key[3])) << 8) |
                       static_cast<uint32_t>(static_cast<unsigned char>(key[4]));
                   TESSERA_ASSIGN_OR_RETURN(v1::TableConfig config,
                                            DecodeCatalogEntry(id, value));
                   catalog.emplace_back(id, std::move(config));
                   return absl::OkStatus();
                 }),
      "reading the table catalog"));
  return catalog;
}

absl::Status CopyRows(const KvStore& source, uint32_t from_id, uint32_t to_id,
                      std::vector<KvWrite>* writes, const std::function<bool(int64_t id)>& keep) {
  return source.Scan(RowPrefix(from_id), [&](absl::string_view key, absl::string_view value) {
    uint32_t table_id = 0;
    int64_t id = 0;
    if (!ParseRowKey(key, &table_id, &id)) return absl::OkStatus();
    if (keep != nullptr && !keep(id)) return absl::OkStatus();
    writes->push_back(KvWrite{RowKey(to_id, id), std::string(value)});
    return absl::OkStatus();
  });
}

absl::Status EraseAll(const KvStore& store, const std::string& prefix,
                      std::vector<KvWrite>* writes) {
  return store.Scan(prefix, [&](absl::string_view key, absl::string_view) {
    writes->push_back(KvWrite{std::string(key), "", /*erase=*/true});
    return absl::OkStatus();
  });
}

absl::StatusOr<std::unique_ptr<KvStore>> OpenCheckpointStore(const KvStoreFactory& open,
                                                             const std::string& dir) {
  KvStoreOptions o;
  o.create_if_missing = false;
  o.read_only = true;
  return open(dir + "/db", o);
}

}  // namespace tessera::storage_internal
