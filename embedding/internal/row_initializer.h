#ifndef TESSERA_EMBEDDING_INTERNAL_ROW_INITIALIZER_H_
#define TESSERA_EMBEDDING_INTERNAL_ROW_INITIALIZER_H_

// The weights a new row starts with: a pure function of (table seed, id), so the same id
// gets the same row whatever the shard, the request order or the process.

#include <cstdint>

#include "tessera/v1/config.pb.h"

namespace tessera::embedding_internal {

class RowInitializer {
 public:
  explicit RowInitializer(const v1::TableConfig& config);

  // Writes the initial weights of `id` into `out` (dim), rounded to what a stored row of
  // the table's dtype holds.
  void InitialWeights(int64_t id, float* out) const;
  // The table's key for per-row random bits (stochastic rounding).
  uint64_t key() const { return key_; }
  // The scale the weights are drawn with (the config's, or 1/sqrt(dim) when it has none).
  float scale() const { return scale_; }

 private:
  int dim_;
  v1::Dtype dtype_;
  v1::InitializerType type_;
  float scale_;
  uint64_t key_;
};

}  // namespace tessera::embedding_internal

#endif  // TESSERA_EMBEDDING_INTERNAL_ROW_INITIALIZER_H_
