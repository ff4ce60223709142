#ifndef TESSERA_EMBEDDING_STORAGE_HOST_CHECKPOINTS_H_
#define TESSERA_EMBEDDING_STORAGE_HOST_CHECKPOINTS_H_

// Checkpoints, through the host, for a collection that cannot write its tables to disk
// itself (the GPU's device tables): `live` serves every lookup and push; at each
// Checkpoint its tables' rows (weights, optimizer state and counters) are copied into
// `store`'s tables of the same names, placed on the host, and `store` checkpoints them.
// The checkpoint is therefore a host checkpoint, in the format and directory any host
// run reads: a run with device tables resumes one taken with host tables and the other
// way round. Restore restores `store` and copies its rows back into fresh live tables.
//
// The store keeps a host copy of the rows between checkpoints (host memory of about the
// live tables' size). Pushes must not run during Checkpoint and Restore (the trainer
// calls them between steps).

#include <memory>

#include "absl/status/statusor.h"
#include "embedding/collection.h"
#include "embedding/storage/durable_collection.h"

namespace tessera::storage {

std::unique_ptr<embedding::EmbeddingCollection> CheckpointThroughHost(
    std::unique_ptr<embedding::EmbeddingCollection> live,
    std::unique_ptr<DurableCollection> store);

}  // namespace tessera::storage

#endif  // TESSERA_EMBEDDING_STORAGE_HOST_CHECKPOINTS_H_
