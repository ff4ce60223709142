#ifndef TESSERA_EMBEDDING_DTYPE_H_
#define TESSERA_EMBEDDING_DTYPE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tessera/v1/config.pb.h"

namespace tessera::embedding {

// Bytes one weight takes in a row stored as `dtype` (4, or 2 for the half types).
int DtypeBytes(v1::Dtype dtype);

// "fp32", "fp16", "bf16".
std::string DtypeName(v1::Dtype dtype);

// Parses a name as written by DtypeName; InvalidArgument for anything else.
absl::StatusOr<v1::Dtype> ParseDtypeName(absl::string_view name);

// Rounds `n` floats to `dtype` to nearest, ties to even, into `out` (n * DtypeBytes).
// fp16 saturates finite values beyond its range at +-65504; NaN stays NaN.
void EncodeWeights(v1::Dtype dtype, const float* in, int n, void* out);

// Like EncodeWeights, but rounds stochastically: each value goes to one of its two
// neighbours in `dtype` with probability proportional to closeness, so updates smaller
// than half a unit in the last place still move the weight on average. The random bits
// are a pure function of `seed`: the same seed gives the same rounding in every process.
void EncodeWeightsStochastic(v1::Dtype dtype, const float* in, int n, uint64_t seed, void* out);

// Widens `n` stored weights of `dtype` to floats (exact).
void DecodeWeights(v1::Dtype dtype, const void* in, int n, float* out);

}  // namespace tessera::embedding

#endif  // TESSERA_EMBEDDING_DTYPE_H_
