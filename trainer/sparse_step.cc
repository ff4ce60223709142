#include "trainer/sparse_step.h"

#include "absl/strings/str_cat.h"
#include "embedding/batch_ops.h"

namespace tessera::trainer {

absl::Status SparseStep::Lookup(embedding::EmbeddingCollection& tables,
                                absl::Span<const std::string> names, const Batch& batch, int dim,
                                bool insert_missing, absl::Span<float> emb) {
  const int nf = static_cast<int>(names.size());
  if (static_cast<int>(batch.ids.size()) != nf) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch has ", batch.ids.size(), " sparse features, the model ", nf));
  }
  const size_t block = static_cast<size_t>(batch.size) * dim;
  lookups_.resize(nf);
  for (int f = 0; f < nf; ++f) {
    embedding::TableBags& part = lookups_[f];
    part.table = names[f];
    part.ids = batch.ids[f];
    part.offsets = batch.offsets[f];
    part.pooling = v1::SUM;
    part.out = emb.subspan(f * block, block);
  }
  embedding::LookupOptions lookup;
  lookup.insert_missing = insert_missing;
  // One call for every table: a remote collection sends one request per shard.
  return tables.LookupBatch(lookups_, lookup);
}

void SparseStep::Gradients(absl::Span<const std::string> names, const Batch& batch, int dim,
                           const float* emb_grad, base::ThreadPool& pool) {
  const int nf = static_cast<int>(names.size());
  const size_t block = static_cast<size_t>(batch.size) * dim;
  unique_ids_.resize(nf);
  unique_grads_.resize(nf);
  inverse_.resize(nf);
  pushes_.resize(nf);
  pool.ParallelFor(nf, [&](int f) {
    embedding::Unique(batch.ids[f], &unique_ids_[f], &inverse_[f]);
    unique_grads_[f].resize(unique_ids_[f].size() * dim);
    embedding::PoolBagsBackward(emb_grad + f * block, dim, inverse_[f], batch.offsets[f], {},
                                v1::SUM, unique_ids_[f].size(), unique_grads_[f].data());
    pushes_[f] = {names[f], unique_ids_[f], unique_grads_[f]};
  });
}

}  // namespace tessera::trainer
