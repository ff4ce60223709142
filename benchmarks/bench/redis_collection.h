#ifndef TESSERA_BENCHMARKS_BENCH_REDIS_COLLECTION_H_
#define TESSERA_BENCHMARKS_BENCH_REDIS_COLLECTION_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/child_process.h"
#include "embedding/collection.h"

namespace tessera::bench {

// A redis-server on 127.0.0.1 (Debian's /usr/bin/redis-server, no persistence), started
// on a free port and stopped on destruction.
class RedisServer {
 public:
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start();
  int port() const { return port_; }
  pid_t pid() const { return process_->pid(); }

 private:
  RedisServer() = default;
  std::unique_ptr<base::LoggedProcess> process_;  // killed on destruction
  int port_ = 0;
};

// The baseline a user would otherwise pick: embedding rows as binary Redis values
// ([weights | optimizer state | update count], little-endian), one key per (table, id).
// Lookups are one MGET per batch; pushes sum repeated ids, then read-modify-write with one
// MGET and one MSET, applying the same optimizer as Tessera in the client. Missing rows
// read as Tessera's initial weights. Calls are serialized over one connection.
absl::StatusOr<std::unique_ptr<embedding::EmbeddingCollection>> NewRedisCollection(int port);

}  // namespace tessera::bench

#endif  // TESSERA_BENCHMARKS_BENCH_REDIS_COLLECTION_H_
