#ifndef TESSERA_TESTS_SUPPORT_MEMORY_SHARDS_H_
#define TESSERA_TESTS_SUPPORT_MEMORY_SHARDS_H_

// Memory-only shards of one shard map, each a real gRPC server on 127.0.0.1 behind its own
// AnswerLoser: the shards of the exactly-once and forwarding suites. The fields are
// public: the suites stop, restart and look into shards as their cases need.

#include <memory>
#include <string>
#include <vector>

#include "embedding/inprocess_collection.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/shard_service.h"
#include "tests/support/answer_loser.h"
#include "tests/support/local_server.h"

namespace tessera::testing {

struct MemoryShards {
  std::vector<std::unique_ptr<embedding::ShardTables>> tables;  // shard k's first at k
  std::vector<std::unique_ptr<server::ShardService>> services;  // shard k's, now
  std::vector<std::unique_ptr<server::ShardService>> retired;   // restarted away
  std::vector<std::unique_ptr<AnswerLoser>> losing;             // shard k's
  std::vector<int> ports;
  std::vector<std::unique_ptr<grpc::Server>> servers;

  // Starts `n` shards, each losing the answers of the `losable` methods it is told to;
  // returns their addresses, in shard order.
  std::vector<std::string> Start(int n, const std::vector<std::string>& losable) {
    std::vector<std::string> addresses;
    for (int k = 0; k < n; ++k) {
      losing.push_back(std::make_unique<AnswerLoser>(losable));
      ports.push_back(0);
      services.emplace_back();
      servers.emplace_back();
      Serve(k, n);
      addresses.push_back(LocalAddress(ports[k]));
    }
    return addresses;
  }
  // Shard k stops and starts again on its port, empty, as a memory-only shard does (its
  // old service is kept: calls may still hold it).
  void Restart(int k) {
    servers[k]->Shutdown();
    servers[k].reset();
    retired.push_back(std::move(services[k]));
    Serve(k, static_cast<int>(services.size()));
  }
  void Shutdown() {
    for (auto& s : servers) {
      if (s) s->Shutdown();
    }
  }

 private:
  // Shard k of `n` on fresh tables, on ports[k] (0: a free one, set here).
  void Serve(int k, int n) {
    tables.push_back(std::move(embedding::NewInProcessCollection(1)).value());
    server::ShardOptions o;
    o.shard_index = k;
    o.num_shards = n;
    services[k] = std::make_unique<server::ShardService>(tables.back().get(), o);
    servers[k] = StartLocalServer(services[k].get(), &ports[k], losing[k].get());
    EXPECT_NE(servers[k], nullptr) << "shard " << k;
  }
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_SUPPORT_MEMORY_SHARDS_H_
