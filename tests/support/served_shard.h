#ifndef TESSERA_TESTS_SUPPORT_SERVED_SHARD_H_
#define TESSERA_TESTS_SUPPORT_SERVED_SHARD_H_

// One shard of a test cluster: a real gRPC server on 127.0.0.1 over its own tables,
// durable in `dir` (a DurableCollection, as tessera-shard --data_dir keeps them) or in
// memory only when `dir` is empty, behind an AnswerLoser when `losable` names methods. The
// fields are public: suites set them before Start(), stop and start the shard again (on
// the same port, from the same directory) and look into its tables.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "embedding/inprocess_collection.h"
#include "embedding/storage/durable_collection.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/shard_service.h"
#include "tests/support/answer_loser.h"
#include "tests/support/local_server.h"

namespace tessera::testing {

struct ServedShard {
  int index = 0;
  int num_shards = 1;
  uint64_t version = 1;  // of the shard map it serves
  size_t change_log_bytes = server::ShardOptions().change_log_bytes;
  std::string dir;                   // a data directory; empty: rows in memory only
  std::vector<std::string> losable;  // methods whose answers `loser` loses when told to
  std::unique_ptr<embedding::ShardTables> tables;
  std::unique_ptr<server::ShardService> service;
  std::unique_ptr<AnswerLoser> loser;  // a new one at every Start; null without `losable`
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // 0 before the first Start (a free one is taken); kept across a restart

  // Opens the tables (from `dir` when set) and serves them. Fails the test when either
  // cannot start.
  void Start() {
    if (dir.empty()) {
      tables = std::move(embedding::NewInProcessCollection(1)).value();
    } else {
      storage::DurableOptions d;
      d.data_dir = dir;
      d.cluster_shard_index = index;
      d.cluster_num_shards = num_shards;
      d.threads = 1;
      auto opened = storage::DurableCollection::Open(d);
      ASSERT_TRUE(opened.ok()) << opened.status();
      tables = *std::move(opened);
    }
    server::ShardOptions o;
    o.shard_index = index;
    o.num_shards = num_shards;
    o.shard_map_version = version;
    o.change_log_bytes = change_log_bytes;
    o.data_dir = !dir.empty();
    service = std::make_unique<server::ShardService>(tables.get(), o);
    loser = losable.empty() ? nullptr : std::make_unique<AnswerLoser>(losable);
    server = StartLocalServer(service.get(), &port, loser.get());
    ASSERT_NE(server, nullptr) << "shard " << index;
  }
  // Stops serving and closes the tables (a durable shard's rows stay in `dir`).
  void Stop() {
    if (server) server->Shutdown();
    server.reset();
    service.reset();
    tables.reset();
  }
  std::string address() const { return LocalAddress(port); }
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_SUPPORT_SERVED_SHARD_H_
