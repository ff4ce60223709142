#ifndef TESSERA_EMBEDDING_STORAGE_FILES_H_
#define TESSERA_EMBEDDING_STORAGE_FILES_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera::storage {

// Writes `contents` to `path` so that a reader sees the old file or the whole new one,
// never a torn one: a temporary file beside it, fsync, rename, fsync of the directory.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// The whole file; NotFound when it does not exist.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Creates `dir` (and its parents) if needed and checks a file can be created and synced
// in it: FailedPrecondition naming the directory when it cannot (read-only, full, not a
// directory), so a server fails at start-up instead of on its first write.
absl::Status EnsureWritableDirectory(const std::string& dir);

// Copies directory tree `from` to `to` (which must not exist). Table files (*.sst, never
// modified once written) are hard-linked when both are on one file system; every other
// file (logs and manifests a store may append to) is copied.
absl::Status CopyTree(const std::string& from, const std::string& to);

// Removes `path` and everything under it; OK when it does not exist.
absl::Status RemoveTree(const std::string& path);

// Records in `data_dir` (file SHARD) which shard of how many it holds and the shard map
// version it serves, or checks the record: FailedPrecondition when the directory was
// written by shard i of n and is now given to another place in the shard map, or holds a
// newer map version than `map_version` (a shard started with a stale map would take
// requests routed by it). A newer `map_version` is recorded.
absl::Status CheckShardPlacement(const std::string& data_dir, int shard_index, int num_shards,
                                 uint64_t map_version = 1);
// Records in `data_dir` that it holds shard `shard_index` of `num_shards` of map version
// `map_version` from now on (a live reshard moved it), in place of what it recorded.
absl::Status RecordShardPlacement(const std::string& data_dir, int shard_index, int num_shards,
                                  uint64_t map_version);

// Bytes of the files under `path` (hard links counted at full size).
int64_t TreeBytes(const std::string& path);

}  // namespace tessera::storage

#endif  // TESSERA_EMBEDDING_STORAGE_FILES_H_
