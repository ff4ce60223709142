#ifndef TESSERA_EMBEDDING_FORWARDING_COLLECTION_H_
#define TESSERA_EMBEDDING_FORWARDING_COLLECTION_H_

#include <vector>

#include "embedding/collection.h"

namespace tessera::embedding {

// A collection that hands every table call to another (`inner`, which must outlive it),
// batches passed through whole: the base of a wrapper that changes a few calls (a store
// for checkpoints, timing, counting) and forwards the rest. Calls it does not forward
// (exports, imports, alters, PushThenLookup, checkpoints) are EmbeddingCollection's
// defaults, made of the forwarded ones, unless the wrapper forwards them too.
class ForwardingCollection : public EmbeddingCollection {
 public:
  explicit ForwardingCollection(EmbeddingCollection* inner) : inner_(inner) {}

  absl::Status CreateTable(const v1::TableConfig& config) override {
    return inner_->CreateTable(config);
  }
  absl::StatusOr<std::vector<v1::TableConfig>> ListTables() const override {
    return inner_->ListTables();
  }
  absl::Status Lookup(absl::string_view table, absl::Span<const int64_t> ids, absl::Span<float> out,
                      const LookupOptions& options) override {
    return inner_->Lookup(table, ids, out, options);
  }
  absl::Status PooledLookup(absl::string_view table, absl::Span<const int64_t> ids,
                            absl::Span<const int32_t> offsets, absl::Span<const float> weights,
                            v1::Pooling pooling, absl::Span<float> out,
                            const LookupOptions& options) override {
    return inner_->PooledLookup(table, ids, offsets, weights, pooling, out, options);
  }
  absl::Status PushGradients(absl::string_view table, absl::Span<const int64_t> ids,
                             absl::Span<const float> gradients, int64_t step) override {
    return inner_->PushGradients(table, ids, gradients, step);
  }
  // Whole: the base class would split them into per-table calls.
  absl::Status LookupBatch(absl::Span<const TableBags> tables,
                           const LookupOptions& options) override {
    return inner_->LookupBatch(tables, options);
  }
  absl::Status PushBatch(absl::Span<const TableGradients> tables, int64_t step,
                         const PushOptions& options) override {
    return inner_->PushBatch(tables, step, options);
  }
  absl::StatusOr<TableUsage> Usage(absl::string_view table) const override {
    return inner_->Usage(table);
  }
  int num_shards() const override { return inner_->num_shards(); }
  absl::Status DropTable(absl::string_view table) override { return inner_->DropTable(table); }

 protected:
  EmbeddingCollection* inner() const { return inner_; }

 private:
  EmbeddingCollection* const inner_;
};

}  // namespace tessera::embedding

#endif  // TESSERA_EMBEDDING_FORWARDING_COLLECTION_H_
