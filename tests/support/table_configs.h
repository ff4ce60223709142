#ifndef TESSERA_TESTS_SUPPORT_TABLE_CONFIGS_H_
#define TESSERA_TESTS_SUPPORT_TABLE_CONFIGS_H_

#include <cstdint>
#include <string>

#include "tessera/v1/config.pb.h"

namespace tessera::testing {

// A table config for tests: `name` of `dim`, seeded `seed`, with optimizer `type` at
// learning rate `lr` and `durability`; every other field as the proto leaves it.
inline v1::TableConfig TestTable(const std::string& name, int dim, uint64_t seed,
                                 v1::OptimizerType type, float lr,
                                 v1::Durability durability = v1::CHECKPOINT) {
  v1::TableConfig c;
  c.set_name(name);
  c.set_dim(dim);
  c.set_seed(seed);
  if (durability != v1::CHECKPOINT) c.set_durability(durability);
  c.mutable_optimizer()->set_type(type);
  c.mutable_optimizer()->set_learning_rate(lr);
  return c;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_SUPPORT_TABLE_CONFIGS_H_
