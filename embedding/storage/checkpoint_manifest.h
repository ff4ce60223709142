#ifndef TESSERA_EMBEDDING_STORAGE_CHECKPOINT_MANIFEST_H_
#define TESSERA_EMBEDDING_STORAGE_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera::storage {

// What a complete checkpoint holds. A checkpoint directory without a valid manifest
// does not exist: the manifest is written last, atomically.
struct CheckpointManifest {
  std::string model;      // "" = every table; else the tables "<model>.*"
  int64_t step = 0;
  int64_t sequence = 0;   // order of creation among the checkpoints of one place
  int64_t created_unix_ms = 0;
  int64_t rows = 0;                      // rows stored (every table, every shard)
  int64_t bytes = 0;                     // bytes on disk
  std::vector<std::string> tables;       // table names
  std::vector<std::string> attachments;  // names of the attached files (dense state, ...)
  std::vector<std::string> shards;       // cluster manifests: the address of each shard
  // Cluster manifests: each shard's checkpoint directory (empty for checkpoints taken
  // before shards reported them); a restore onto another shard count reads them.
  std::vector<std::string> shard_dirs;
};

// Text, one `key=value` per line, ending with a `crc32c=` line over everything before it.
std::string EncodeManifest(const CheckpointManifest& m);
// DataLoss naming `path` for a torn, truncated or edited manifest.
absl::StatusOr<CheckpointManifest> DecodeManifest(absl::string_view text, const std::string& path);

// Reads and decodes the manifest at `path`.
absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& path);

// InvalidArgument unless `name` can name an attachment file: 1-128 of [A-Za-z0-9._-],
// not starting with '.'.
absl::Status ValidateAttachmentName(absl::string_view name);

// The directory name of checkpoint `step` of `model` under a checkpoints root: "<step>"
// for the whole collection, "<model>.<step>" for a model.
std::string CheckpointDirName(const std::string& model, int64_t step);

// Complete checkpoints under `root` (<root>/<CheckpointDirName>/MANIFEST), oldest (first
// created) first, with their directories. Each directory without a valid manifest for its
// own model and step is skipped and `log` hears why (a missing manifest: incomplete; a bad
// one: torn or edited).
std::vector<std::pair<std::string, CheckpointManifest>> ListCompleteCheckpoints(
    const std::string& root, const std::function<void(const std::string&)>& log);

// The checkpoint of `model` and `step` among `complete` (as ListCompleteCheckpoints
// returns them), or the model's newest when step < 0; NotFound naming `root` when there
// is none.
absl::StatusOr<const std::pair<std::string, CheckpointManifest>*> ChooseCheckpoint(
    const std::vector<std::pair<std::string, CheckpointManifest>>& complete, int64_t step,
    const std::string& root, const std::string& model = "");

// AlreadyExists when `complete` holds checkpoint `step` of `model`: one is never
// overwritten.
absl::Status RefuseOverwrite(
    const std::vector<std::pair<std::string, CheckpointManifest>>& complete,
    const std::string& model, int64_t step);

// The directories of `complete` (oldest created first) beyond each model's newest `keep`
// (0 = keep all): what retention removes.
std::vector<std::string> RetiredCheckpoints(
    const std::vector<std::pair<std::string, CheckpointManifest>>& complete, int keep);

// The next sequence number after those of `complete`.
int64_t NextCheckpointSequence(
    const std::vector<std::pair<std::string, CheckpointManifest>>& complete);

// Reads the attachments `m` names from <dir>/attachments/ into `out` (replacing it).
absl::Status ReadAttachments(const std::string& dir, const CheckpointManifest& m,
                             std::map<std::string, std::string>* out);

}  // namespace tessera::storage

#endif  // TESSERA_EMBEDDING_STORAGE_CHECKPOINT_MANIFEST_H_
