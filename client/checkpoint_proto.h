#ifndef TESSERA_CLIENT_CHECKPOINT_PROTO_H_
#define TESSERA_CLIENT_CHECKPOINT_PROTO_H_

#include "embedding/collection.h"
#include "tessera/v1/embedding_service.pb.h"

namespace tessera::client {

// embedding::CheckpointInfo <-> its wire form.
inline void ToProto(const embedding::CheckpointInfo& info, v1::CheckpointInfo* out) {
  out->set_step(info.step);
  out->set_rows(info.rows);
  out->set_bytes(info.bytes);
  out->set_created_unix_ms(info.created_unix_ms);
  out->set_seconds(info.seconds);
}

inline embedding::CheckpointInfo FromProto(const v1::CheckpointInfo& p) {
  embedding::CheckpointInfo info;
  info.step = p.step();
  info.rows = p.rows();
  info.bytes = p.bytes();
  info.created_unix_ms = p.created_unix_ms();
  info.seconds = p.seconds();
  return info;
}

}  // namespace tessera::client

#endif  // TESSERA_CLIENT_CHECKPOINT_PROTO_H_
