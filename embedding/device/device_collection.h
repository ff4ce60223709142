#ifndef TESSERA_EMBEDDING_DEVICE_DEVICE_COLLECTION_H_
#define TESSERA_EMBEDDING_DEVICE_DEVICE_COLLECTION_H_

// An EmbeddingCollection whose tables are DeviceTables on one GPU: what
// `tessera-train --shards=cuda` trains with. One shard (the device); pushes are summed per
// id and checked on the host, then applied on the device; rows export and import in the
// host's RowBlocks, so a device table's rows move to host tables and back.

#include <memory>

#include "absl/status/statusor.h"
#include "embedding/collection.h"

namespace tessera::embedding::device {

// FailedPrecondition, naming what is missing, when this build or machine cannot hold
// device tables on `device`.
absl::StatusOr<std::unique_ptr<EmbeddingCollection>> NewDeviceCollection(int device);

}  // namespace tessera::embedding::device

#endif  // TESSERA_EMBEDDING_DEVICE_DEVICE_COLLECTION_H_
