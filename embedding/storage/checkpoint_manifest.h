#ifndef TESSERA_EMBEDDING_STORAGE_CHECKPOINT_MANIFEST_H_
#define TESSERA_EMBEDDING_STORAGE_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera::storage {

// What a complete checkpoint holds. A checkpoint directory without a valid manifest
// does not exist: the manifest is written last, atomically.
struct CheckpointManifest {
  int64_t step = 0;
  int64_t created_unix_ms = 0;
  int64_t rows = 0;                      // rows stored (every table, every shard)
  int64_t bytes = 0;                     // bytes on disk
  std::vector<std::string> tables;       // table names
  std::vector<std::string> attachments;  // names of the attached files (dense state, ...)
  std::vector<std::string> shards;       // cluster manifests: the address of each shard
};

// Text, one `key=value` per line, ending with a `crc32c=` line over everything before it.
std::string EncodeManifest(const CheckpointManifest& m);
// DataLoss naming `path` for a torn, truncated or edited manifest.
absl::StatusOr<CheckpointManifest> DecodeManifest(absl::string_view text, const std::string& path);

// Reads and decodes the manifest at `path`.
absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& path);

}  // namespace tessera::storage

#endif  // TESSERA_EMBEDDING_STORAGE_CHECKPOINT_MANIFEST_H_
