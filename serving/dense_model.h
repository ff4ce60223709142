#ifndef TESSERA_SERVING_DENSE_MODEL_H_
#define TESSERA_SERVING_DENSE_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/object_pool.h"
#include "embedding/collection.h"
#include "embedding/serving_table.h"
#include "tessera/v1/serving.pb.h"
#include "trainer/dense_backend.h"

namespace tessera::serving {

// A published dense network (trainer::DensePublisher) ready to score: the trainer's own
// CPU forward pass, a backend per concurrent caller. Immutable once made: a replica swaps
// in a new one whole. Thread-safe.
class DenseModel {
 public:
  // InvalidArgument for a snapshot whose shape is not a valid DLRM or whose parameters do
  // not fit it.
  static absl::StatusOr<std::shared_ptr<const DenseModel>> Make(const v1::DenseSnapshot& snapshot);

  int64_t step() const { return snapshot_.step(); }
  const trainer::DlrmConfig& config() const { return config_; }
  // The sparse features' tables, in feature order.
  const google::protobuf::RepeatedPtrField<std::string>& tables() const {
    return snapshot_.tables();
  }
  // What it was made from, its parameters included.
  const v1::DenseSnapshot& snapshot() const { return snapshot_; }

  // The logits of `samples` samples: `dense` (samples, num_dense), `embeddings`
  // (features, samples, emb_dim), as the trainer's evaluation passes them.
  absl::Status Forward(int samples, const float* dense, const float* embeddings,
                       float* logits) const;

 private:
  DenseModel(const v1::DenseSnapshot& snapshot, trainer::DlrmConfig config);
  std::unique_ptr<trainer::DenseBackend> NewBackend() const;

  const v1::DenseSnapshot snapshot_;
  const trainer::DlrmConfig config_;  // the shape snapshot_ gives
  mutable client::ObjectPool<trainer::DenseBackend> backends_;
};

// One sample batch's sparse input for feature f: ids and (samples + 1) CSR offsets (none:
// one id a sample).
struct FeatureBags {
  absl::Span<const int64_t> ids;
  absl::Span<const int32_t> offsets;
};

// One table's lookup on a replica's rows: the rows of `bags.ids`, or (offsets set) their
// bags pooled as bags.pooling says, into bags.out, as the training tables answer it (the
// distinct ids' rows, then embedding::PoolBags).
absl::Status LookupRows(const embedding::ServingTable& table, const embedding::TableBags& bags);

// The pooled (SUM) embeddings of `features` (one per table of `tables`, in order) into
// `out` (features, samples, dim), read from `tables`' rows: the trainer's evaluation's
// pooled lookup, in the same order of additions. InvalidArgument for bags that do not fit
// `samples` or ids outside a fixed vocabulary.
absl::Status PooledEmbeddings(absl::Span<const embedding::ServingTable* const> tables,
                              absl::Span<const FeatureBags> features, int samples,
                              absl::Span<float> out);

}  // namespace tessera::serving

#endif  // TESSERA_SERVING_DENSE_MODEL_H_
