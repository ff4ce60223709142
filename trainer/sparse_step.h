#ifndef TESSERA_TRAINER_SPARSE_STEP_H_
#define TESSERA_TRAINER_SPARSE_STEP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"
#include "embedding/collection.h"
#include "trainer/batch.h"

namespace tessera::trainer {

// A training step's work on its tables, apart from the dense network: the pooled lookup of
// every feature's bags, and the embedding gradients that go back (each feature's distinct
// ids and their summed gradient rows). The Trainer runs it every step; the sparse-step
// benchmark runs it alone. Buffers are reused from step to step.
class SparseStep {
 public:
  // A push sent with a lookup, applied before it (EmbeddingCollection::PushThenLookup).
  struct PushFirst {
    absl::Span<const embedding::TableGradients> parts;
    int64_t step = 0;
    embedding::PushOptions options;
  };
  // Looks up `batch`'s pooled (SUM) embeddings of feature f from table names[f] into
  // emb[f * size * dim ...], (features, size, dim), in one call for every table; with
  // `push_first`, that push is applied first, in the same call.
  absl::Status Lookup(embedding::EmbeddingCollection& tables, absl::Span<const std::string> names,
                      const Batch& batch, int dim, bool insert_missing, absl::Span<float> emb,
                      const PushFirst* push_first = nullptr);

  // From the gradients of the pooled embeddings (laid out as emb), each feature's distinct
  // ids and their summed gradient rows, a feature to a thread of `pool`; pushes() then
  // holds them. The sums' order per row is the ids' order, whatever the pool's size. When
  // the lookup of `batch` through this SparseStep left plans (embedding::IdPlan: an
  // in-process collection), the ids are the plans' and the push hands the plans back.
  void Gradients(absl::Span<const std::string> names, const Batch& batch, int dim,
                 const float* emb_grad, base::ThreadPool& pool);

  // The parts Gradients made, one per feature, for EmbeddingCollection::PushBatch.
  absl::Span<const embedding::TableGradients> pushes() const { return pushes_; }
  // True when pushes() are of the batch this SparseStep looked up last, creating its rows
  // (embedding::PushOptions::after_lookup).
  bool after_lookup() const { return after_lookup_; }

 private:
  std::vector<embedding::TableBags> lookups_;           // per feature
  std::vector<embedding::IdPlan> plans_;                // per feature, from the lookup
  const Batch* looked_up_ = nullptr;                    // the batch the plans are of
  bool inserted_ = false;                               // that lookup created missing rows
  bool after_lookup_ = false;                           // pushes() are of looked_up_
  std::vector<std::vector<int64_t>> unique_ids_;        // per feature
  std::vector<std::vector<int32_t>> inverse_;           // per feature: ids' unique positions
  std::vector<std::vector<float>> unique_grads_;        // per feature: (unique, dim)
  std::vector<embedding::TableGradients> pushes_;       // per feature
};

}  // namespace tessera::trainer

#endif  // TESSERA_TRAINER_SPARSE_STEP_H_
