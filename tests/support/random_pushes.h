#ifndef TESSERA_TESTS_SUPPORT_RANDOM_PUSHES_H_
#define TESSERA_TESTS_SUPPORT_RANDOM_PUSHES_H_

// The random training steps the tests push: a fixed number of ids a step, drawn uniformly
// (with repeats) from [0, id_range), and N(0, 1) gradients; the same seed gives the same
// steps.

#include <cstdint>
#include <random>
#include <vector>

namespace tessera::testing {

class RandomPushes {
 public:
  RandomPushes(uint64_t seed, int ids_per_step, int64_t id_range, int dim)
      : rng_(seed), ids_per_step_(ids_per_step), id_range_(id_range), dim_(dim) {}

  // The next step's ids and their gradients (ids x dim).
  void Next(std::vector<int64_t>* ids, std::vector<float>* gradients) {
    ids->resize(ids_per_step_);
    for (int64_t& id : *ids) id = static_cast<int64_t>(rng_() % id_range_);
    gradients->resize(ids->size() * dim_);
    for (float& x : *gradients) x = normal_(rng_);
  }

 private:
  std::mt19937_64 rng_;
  std::normal_distribution<float> normal_{0.0f, 1.0f};
  int ids_per_step_;
  int64_t id_range_;
  int dim_;
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_SUPPORT_RANDOM_PUSHES_H_
