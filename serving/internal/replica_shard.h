#ifndef TESSERA_SERVING_INTERNAL_REPLICA_SHARD_H_
#define TESSERA_SERVING_INTERNAL_REPLICA_SHARD_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "client/embedding_client.h"
#include "client/reconnecting_stub.h"
#include "client/shard_router.h"
#include "serving/replica.h"
#include "tessera/v1/embedding_service.grpc.pb.h"

namespace tessera::serving {

// A shard the replica follows: where it stands in the shard's change log.
struct Replica::Shard {
  Shard(int index, std::string address, const client::ClientOptions& options)
      : index(index),
        address(address),
        stub(client::NewShardStub(address, options.security, options.max_message_bytes)) {}
  int index;
  std::string address;
  std::unique_ptr<client::ReconnectingStub<v1::EmbeddingShard>> stub;
  v1::ChangeCursor cursor;  // log 0: not read yet (a snapshot first)
  std::atomic<bool> caught_up{false};
  std::atomic<int64_t> step{-1};       // the newest training step read to
  std::atomic<int64_t> head_step{-1};  // the newest the shard said it applied
};

}  // namespace tessera::serving

#endif  // TESSERA_SERVING_INTERNAL_REPLICA_SHARD_H_
