#ifndef TESSERA_TESTS_SUPPORT_REFERENCE_CLUSTER_H_
#define TESSERA_TESTS_SUPPORT_REFERENCE_CLUSTER_H_

// The fixture the exactly-once suites share (exactly_once_test, reshard_test): a
// coordinator on 127.0.0.1 over shards the suite starts its own way, and a reference
// collection in this process that takes each acknowledged push once: whatever the faults,
// the cluster's rows must equal the reference's.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "client/embedding_client.h"
#include "client/shard_router.h"
#include "embedding/collection.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/coordinator_service.h"
#include "tests/support/answer_loser.h"
#include "tests/support/local_server.h"
#include "tests/support/test_client.h"

namespace tessera::testing {

class ReferenceClusterTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (coordinator_server_ != nullptr) coordinator_server_->Shutdown();
  }

  // The coordinator over `shards` (addresses in shard order, map version 1), routing with
  // `router`; `losing` (null: nothing) loses the answers of the calls it is told to;
  // `store` (null: none) keeps its tables and checkpoints.
  void StartCoordinator(const std::vector<std::string>& shards, const client::RouterOptions& router,
                        AnswerLoser* losing = nullptr, storage::CoordinatorStore* store = nullptr) {
    router_ = std::make_unique<client::ShardRouter>(shards, router);
    coordinator_ = std::make_unique<server::CoordinatorService>(
        router_.get(), 1, server::CoordinatorOptions(), store);
    coordinator_server_ = StartLocalServer(coordinator_.get(), &coordinator_port_, losing);
    ASSERT_NE(coordinator_server_, nullptr);
    coordinator_address_ = LocalAddress(coordinator_port_);
  }

  // The router options of a coordinator whose shards the test restarts or reshards: calls
  // with `deadline`, retried 4 times from 20 ms on.
  static client::RouterOptions RetryingRouter(std::chrono::milliseconds deadline) {
    client::RouterOptions ro;
    ro.deadline = deadline;
    ro.retry.max_retries = 4;
    ro.retry.initial_backoff = std::chrono::milliseconds(20);
    return ro;
  }

  std::unique_ptr<client::EmbeddingClient> Connect(client::ClientOptions::Mode mode,
                                                   int max_retries = 8) {
    return ConnectForTest(coordinator_address_, mode, client_deadline_, max_retries);
  }

  void CreateBoth(client::EmbeddingClient& c, const v1::TableConfig& config) {
    ASSERT_TRUE(c.CreateTable(config).ok());
    ASSERT_TRUE(reference_->CreateTable(config).ok());
  }
  // `c` and the reference both take a push of `gradients` to `ids` of `table` in `step`.
  void PushBoth(client::EmbeddingClient& c, const std::string& table,
                const std::vector<int64_t>& ids, const std::vector<float>& gradients,
                int64_t step) {
    ASSERT_TRUE(c.PushGradients(table, ids, gradients, step).ok());
    ASSERT_TRUE(reference_->PushGradients(table, ids, gradients, step).ok());
  }

  std::chrono::milliseconds client_deadline_{3000};  // of each call of Connect's clients
  std::unique_ptr<client::ShardRouter> router_;
  std::unique_ptr<server::CoordinatorService> coordinator_;
  std::unique_ptr<grpc::Server> coordinator_server_;
  int coordinator_port_ = 0;
  std::string coordinator_address_;
  std::unique_ptr<embedding::EmbeddingCollection> reference_;
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_SUPPORT_REFERENCE_CLUSTER_H_
