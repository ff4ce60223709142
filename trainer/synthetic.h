#ifndef TESSERA_TRAINER_SYNTHETIC_H_
#define TESSERA_TRAINER_SYNTHETIC_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/batch.h"

namespace tessera::trainer {

// A click-log generator with a planted teacher model, so the quality a learner can reach
// is known. Each sparse feature draws a rank from Zipf(zipf_s) over its cardinality and
// maps it to an arbitrary 64-bit id. The teacher's logit is
//   bias + w . x + sum_f a_f(id_f) + interaction_scale / sqrt(k) * sum_{f even} <u_f, u_{f+1}>
// with per-id scalars a (N(0, id_effect_scale^2)) and per-id vectors u (N(0, 1)^k), and
// the label is Bernoulli(sigmoid(logit)).
struct SyntheticConfig {
  int num_dense = 13;                  // dense features, each U(0, 3)
  std::vector<int64_t> cardinalities;  // one per sparse feature
  double zipf_s = 1.1;                 // Zipf exponent of id popularity
  int teacher_dim = 4;                 // k, the teacher's latent dimension
  float id_effect_scale = 0.4f;        // std of the per-id scalar effects
  float interaction_scale = 0.5f;      // weight of the latent pairwise terms
  float dense_scale = 0.4f;            // std of the dense weights w
  float bias = -1.0f;                  // base logit (CTR about 0.3)
  uint64_t seed = 1;
};

// The default shape: 26 sparse features as in Criteo, cardinalities from 10 to 2000.
std::vector<int64_t> DefaultCardinalities(int num_sparse);

// Thread-safe after construction: MakeBatch may run on many threads at once.
class SyntheticGenerator {
 public:
  static absl::StatusOr<std::unique_ptr<SyntheticGenerator>> Create(const SyntheticConfig& config);

  // Batch `index` of `size` samples: a pure function of (seed, index, size).
  // Batches with bit 62 of the index set form the held-out stream.
  void MakeBatch(int64_t index, int size, Batch* batch) const;

  // `samples` held-out samples, disjoint in index space from training batches.
  Batch MakeHeldOut(int64_t samples) const;

  // The id a feature's rank maps to.
  int64_t IdOf(int feature, int64_t rank) const;

  // The teacher's click probability of one sample.
  float TeacherProbability(const float* dense, const std::vector<int64_t>& ranks) const;

  const SyntheticConfig& config() const { return config_; }
  int num_sparse() const { return static_cast<int>(config_.cardinalities.size()); }

 private:
  explicit SyntheticGenerator(const SyntheticConfig& config);

  SyntheticConfig config_;
  std::vector<float> dense_w_;              // (num_dense)
  std::vector<std::vector<double>> cdf_;    // [feature] -> Zipf CDF over ranks
  std::vector<std::vector<float>> effect_;  // [feature] -> a per rank
  std::vector<std::vector<float>> latent_;  // [feature] -> (rank, k)
};

inline constexpr int64_t kHeldOutIndexBit = int64_t{1} << 62;

}  // namespace tessera::trainer

#endif  // TESSERA_TRAINER_SYNTHETIC_H_
