#ifndef TESSERA_TRAINER_COORDINATOR_RENDEZVOUS_H_
#define TESSERA_TRAINER_COORDINATOR_RENDEZVOUS_H_

// The coordinator's rendezvous store (its StoreSet/StoreGet/StoreAdd RPCs) as the
// data-parallel workers see it. For binaries that link the client and the trainer.

#include <chrono>
#include <string>
#include <vector>

#include "client/embedding_client.h"
#include "trainer/data_parallel.h"

namespace tessera::trainer {

class CoordinatorRendezvous final : public RendezvousKv {
 public:
  // `client` must outlive this.
  explicit CoordinatorRendezvous(client::EmbeddingClient* client) : client_(client) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    return client_->StoreSet(key, value);
  }
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               std::chrono::milliseconds timeout) override {
    return client_->StoreGet(keys, timeout);
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return client_->StoreAdd(key, delta);
  }

 private:
  client::EmbeddingClient* client_;
};

}  // namespace tessera::trainer

#endif  // TESSERA_TRAINER_COORDINATOR_RENDEZVOUS_H_
