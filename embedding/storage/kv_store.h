#ifndef TESSERA_EMBEDDING_STORAGE_KV_STORE_H_
#define TESSERA_EMBEDDING_STORAGE_KV_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tessera::storage {

// One write of a batch: a put, or a delete when `erase`.
struct KvWrite {
  std::string key;
  std::string value;
  bool erase = false;
};

// An ordered, durable key-value store: what a shard keeps its rows and catalog in.
// Errors: kInternal for an I/O error, kResourceExhausted for a full disk, kDataLoss for
// corruption the store itself detects, kFailedPrecondition when it cannot be opened.
// Thread-safe.
class KvStore {
 public:
  virtual ~KvStore() = default;

  // Applies every write or none. With `sync` the batch is in the write-ahead log on disk
  // (fsynced) before OK is returned.
  virtual absl::Status Write(absl::Span<const KvWrite> writes, bool sync) = 0;

  // Applies the writes without the write-ahead log: faster, and a crash before the next
  // Checkpoint() (which flushes them to table files) loses them. For data that is only
  // meant to survive as part of that checkpoint.
  virtual absl::Status WriteUnlogged(absl::Span<const KvWrite> writes) = 0;

  // The value of `key`, or nullopt when there is none.
  virtual absl::StatusOr<std::optional<std::string>> Get(absl::string_view key) const = 0;

  // Calls fn for every key that starts with `prefix`, in key order, and stops at fn's
  // first non-OK status, which it returns.
  virtual absl::Status Scan(
      absl::string_view prefix,
      const std::function<absl::Status(absl::string_view key, absl::string_view value)>& fn)
      const = 0;

  // Writes a consistent copy of the whole store into `dir` (which must not exist yet);
  // the copy opens with the same factory. Files are hard-linked where they can be.
  virtual absl::Status Checkpoint(const std::string& dir) = 0;

  // Bytes on disk, approximately.
  virtual int64_t ApproximateBytes() const = 0;

  // Bytes of the keys and values that start with `prefix`, approximately (0 when the
  // store cannot tell). A hint for sizing memory before a scan.
  virtual int64_t ApproximateBytesOf(absl::string_view prefix) const { return 0; }
};

struct KvStoreOptions {
  bool create_if_missing = true;  // create an empty store when `path` has none
  bool read_only = false;         // open for reads only: the store's files are not changed
};

// Opens (or creates) a store in directory `path`.
using KvStoreFactory = std::function<absl::StatusOr<std::unique_ptr<KvStore>>(
    const std::string& path, const KvStoreOptions& options)>;

// RocksDB, with checksums verified on every read.
absl::StatusOr<std::unique_ptr<KvStore>> OpenRocksDbStore(const std::string& path,
                                                          const KvStoreOptions& options);

}  // namespace tessera::storage

#endif  // TESSERA_EMBEDDING_STORAGE_KV_STORE_H_
