#include "trainer/sparse_step.h"

#include "absl/strings/str_cat.h"
#include "embedding/batch_ops.h"

namespace tessera::trainer {

absl::Status SparseStep::Lookup(embedding::EmbeddingCollection& tables,
                                absl::Span<const std::string> names, const Batch& batch, int dim,
                                bool insert_missing, absl::Span<float> emb,
                                const PushFirst* push_first) {
  const int nf = static_cast<int>(names.size());
  if (static_cast<int>(batch.ids.size()) != nf) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch has ", batch.ids.size(), " sparse features, the model ", nf));
  }
  const size_t block = static_cast<size_t>(batch.size) * dim;
  lookups_.resize(nf);
  plans_.resize(nf);
  for (int f = 0; f < nf; ++f) {
    plans_[f].valid = false;
    embedding::TableBags& part = lookups_[f];
    part.plan = &plans_[f];
    part.table = names[f];
    part.ids = batch.ids[f];
    part.offsets = batch.offsets[f];
    part.pooling = v1::SUM;
    part.out = emb.subspan(f * block, block);
  }
  embedding::LookupOptions lookup;
  lookup.insert_missing = insert_missing;
  // One call for every table: a remote collection sends one request per shard.
  absl::Status s = push_first == nullptr
                       ? tables.LookupBatch(lookups_, lookup)
                       : tables.PushThenLookup(push_first->parts, push_first->step,
                                               push_first->options, lookups_, lookup);
  looked_up_ = s.ok() ? &batch : nullptr;
  inserted_ = insert_missing;
  return s;
}

namespace {

// Below this many ids a step, a table's gradients take less time than waking a thread for
// them (the default run's 6,656 do): they stay on the calling thread.
constexpr size_t kParallelGradientIds = 16384;

}  // namespace

void SparseStep::Gradients(absl::Span<const std::string> names, const Batch& batch, int dim,
                           const float* emb_grad, base::ThreadPool& pool) {
  const int nf = static_cast<int>(names.size());
  const size_t block = static_cast<size_t>(batch.size) * dim;
  unique_ids_.resize(nf);
  unique_grads_.resize(nf);
  inverse_.resize(nf);
  pushes_.resize(nf);
  plans_.resize(nf);
  after_lookup_ = looked_up_ == &batch && inserted_;
  size_t ids = 0;
  for (int f = 0; f < nf; ++f) ids += batch.ids[f].size();
  pool.For(ids, kParallelGradientIds).ParallelFor(nf, [&](int f) {
    const embedding::IdPlan& plan = plans_[f];
    // Plans are of the batch this SparseStep looked up last, when its collection plans.
    const bool planned =
        looked_up_ == &batch && plan.valid && plan.inverse.size() == batch.ids[f].size();
    if (!planned) embedding::Unique(batch.ids[f], &unique_ids_[f], &inverse_[f]);
    const std::vector<int64_t>& ids = planned ? plan.unique_ids : unique_ids_[f];
    const std::vector<int32_t>& inverse = planned ? plan.inverse : inverse_[f];
    unique_grads_[f].resize(ids.size() * dim);
    embedding::PoolBagsBackward(emb_grad + f * block, dim, inverse, batch.offsets[f], {},
                                v1::SUM, ids.size(), unique_grads_[f].data());
    pushes_[f] = {names[f], ids, unique_grads_[f], planned ? &plan : nullptr};
  });
}

}  // namespace tessera::trainer
