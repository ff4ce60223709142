#ifndef TESSERA_EMBEDDING_SHARDING_H_
#define TESSERA_EMBEDDING_SHARDING_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "embedding/row_math.h"
#include "tessera/v1/config.pb.h"

namespace tessera::embedding {

// A strong 64-bit mixer (the splitmix64 finaliser): every input bit affects every
// output bit. Pure, so it gives the same answer in every process, on every host and on
// a device (row_math::Mix, which the device table's kernels call).
constexpr uint64_t Mix64(uint64_t x) { return row_math::Mix(x); }

// Lamping & Veach's jump consistent hash: maps `key` to a bucket in [0, num_buckets)
// such that growing num_buckets from n to n+1 moves only about 1/(n+1) of the keys.
// num_buckets must be >= 1.
constexpr int32_t JumpConsistentHash(uint64_t key, int32_t num_buckets) {
  // The loop below, without its divisions where the answer is one bit: with one bucket it
  // ends in 0; with two, its first step leaves it in 0 exactly when the step's key has its
  // top bit clear (j = 2^31 / ((key >> 33) + 1) >= 2 iff (key >> 33) < 2^30), and
  // otherwise its second step ends it in 1.
  if (num_buckets == 1) return 0;
  if (num_buckets == 2) return static_cast<int32_t>((key * 2862933555777941757ULL + 1) >> 63);
  int64_t b = -1;
  int64_t j = 0;
  while (j < num_buckets) {
    b = j;
    key = key * 2862933555777941757ULL + 1;
    j = static_cast<int64_t>(static_cast<double>(b + 1) * (static_cast<double>(1LL << 31) /
                                                           static_cast<double>((key >> 33) + 1)));
  }
  return static_cast<int32_t>(b);
}

// The shard that owns `id` of a table with `table_seed` among `num_shards` shards.
// Every part of the system (in-process collection, coordinator, smart client) routes
// with this one function.
constexpr int32_t ShardOf(int64_t id, uint64_t table_seed, int32_t num_shards) {
  return JumpConsistentHash(Mix64(static_cast<uint64_t>(id) ^ table_seed), num_shards);
}

// The shard among `num_shards` that holds `id` of table `config`: ShardOf (a jump hash of
// the mixed id) for a dynamic vocabulary; for a fixed one (vocabulary_size > 0) every
// num_shards-th id, counted in units of `outer` (the shard count of the level above: a
// cluster's shard k of M holds ids k + M i and splits them by i), so a shard's rows sit
// densely at id / (outer * num_shards). Any id maps somewhere; its table refuses ids
// outside the vocabulary.
// Inline: routers and shards call it for every id of every request.
inline int32_t ShardOfRow(const v1::TableConfig& config, int64_t id, int32_t num_shards,
                          int32_t outer = 1) {
  if (config.vocabulary_size() == 0) return ShardOf(id, config.seed(), num_shards);
  return static_cast<int32_t>(static_cast<uint64_t>(id) / static_cast<uint64_t>(outer) %
                              static_cast<uint64_t>(num_shards));
}
// True when shard `shard_index` of `num_shards` (ShardOfRow) holds every id of `ids`.
bool OwnsAll(const v1::TableConfig& config, absl::Span<const int64_t> ids, int32_t shard_index,
             int32_t num_shards);

// InvalidArgument naming the first of `ids` outside the fixed vocabulary of `config`
// (vocabulary_size > 0); OK for a dynamic vocabulary.
absl::Status CheckVocabulary(const v1::TableConfig& config, absl::Span<const int64_t> ids);

}  // namespace tessera::embedding

#endif  // TESSERA_EMBEDDING_SHARDING_H_
