#ifndef TESSERA_EMBEDDING_STORAGE_COORDINATOR_STORE_H_
#define TESSERA_EMBEDDING_STORAGE_COORDINATOR_STORE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "embedding/collection.h"
#include "embedding/storage/checkpoint_manifest.h"
#include "tessera/v1/config.pb.h"

namespace tessera::storage {

// The coordinator's durable state under one directory:
//
//   <dir>/state                              tables and shard map (CoordinatorState),
//                                            replaced atomically, with a checksum
//   <dir>/checkpoints/<step>/attachments/<name>
//   <dir>/checkpoints/<step>/MANIFEST        the cluster checkpoint exists once this does
//   <dir>/checkpoints/<model>.<step>/...     the same for a model's checkpoint
//
// The shards keep their rows; a cluster checkpoint is complete when every shard has
// taken its own and this manifest, written last, names them. Thread-safe.
class CoordinatorStore {
 public:
  // Opens (or creates) the state in `dir`: FailedPrecondition when it cannot be written,
  // DataLoss when the state file is corrupt.
  static absl::StatusOr<std::unique_ptr<CoordinatorStore>> Open(
      const std::string& dir, int keep_checkpoints,
      std::function<void(const std::string&)> log = nullptr);

  v1::CoordinatorState state() const;
  // Replaces the durable state; on error the old one stays.
  absl::Status Save(const v1::CoordinatorState& state);

  // Records checkpoint `manifest.step` of `manifest.model` (after every shard took its
  // own): attachments, then the manifest; then drops that model's checkpoints beyond its
  // newest `keep_checkpoints` (by creation). AlreadyExists when it is recorded already.
  absl::StatusOr<CheckpointManifest> CommitCheckpoint(CheckpointManifest manifest,
                                                      const embedding::Attachments& attachments);
  // Checkpoint `step` of `model` (-1: its newest complete one) and its attachments;
  // NotFound if none.
  absl::StatusOr<CheckpointManifest> FindCheckpoint(int64_t step,
                                                    embedding::Attachments* attachments,
                                                    const std::string& model = "") const;
  // Complete checkpoints of every model, oldest (first created) first; incomplete or torn
  // ones are logged and skipped.
  std::vector<CheckpointManifest> ListCheckpoints() const;

 private:
  CoordinatorStore(std::string dir, int keep, std::function<void(const std::string&)> log);
  std::vector<std::pair<std::string, CheckpointManifest>> Complete() const;
  void Log(const std::string& line) const;

  const std::string dir_;
  const int keep_;
  const std::function<void(const std::string&)> log_;
  mutable absl::Mutex mu_;
  v1::CoordinatorState state_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::storage

#endif  // TESSERA_EMBEDDING_STORAGE_COORDINATOR_STORE_H_
