#ifndef TESSERA_EMBEDDING_STORAGE_INTERNAL_STORE_SPILL_H_
#define TESSERA_EMBEDDING_STORAGE_INTERNAL_STORE_SPILL_H_

#include <cstdint>
#include <string>

#include "embedding/embedding_table.h"
#include "embedding/storage/kv_store.h"
#include "tessera/v1/config.pb.h"

namespace tessera::storage_internal {

// Evicted rows of one table of a storage::DurableCollection to and from its store: a
// write-through table's under its durable row keys, a checkpointed table's changed rows
// under spill keys until the next checkpoint. Called under a stripe lock of the table; it
// touches only the store.
class StoreSpill final : public embedding::RowSpill {
 public:
  StoreSpill(storage::KvStore* store, uint32_t table_id, const v1::TableConfig& config,
             int state_floats)
      : store_(store),
        table_id_(table_id),
        name_(config.name()),
        dim_(config.dim()),
        state_floats_(state_floats),
        write_through_(config.durability() == v1::WRITE_THROUGH) {}

  absl::Status Evict(int64_t id, const float* weights, const float* state,
                     const embedding::RowMeta& meta, bool dirty) override;
  absl::StatusOr<bool> Fetch(int64_t id, float* weights, float* state, embedding::RowMeta* meta,
                             bool* dirty) override;
  void Drop(int64_t id) override;

 private:
  storage::KvStore* const store_;
  const uint32_t table_id_;
  const std::string name_;
  const int dim_, state_floats_;
  const bool write_through_;
};

}  // namespace tessera::storage_internal

#endif  // TESSERA_EMBEDDING_STORAGE_INTERNAL_STORE_SPILL_H_
