#ifndef TESSERA_WIRE_CHECKPOINT_PROTO_H_
#define TESSERA_WIRE_CHECKPOINT_PROTO_H_

#include "embedding/collection.h"
#include "embedding/storage/checkpoint_manifest.h"
#include "tessera/v1/embedding_service.pb.h"

namespace tessera::wire {

// embedding::CheckpointInfo <-> its wire form.
inline void ToProto(const embedding::CheckpointInfo& info, v1::CheckpointInfo* out) {
  out->set_model(info.model);
  out->set_step(info.step);
  out->set_rows(info.rows);
  out->set_bytes(info.bytes);
  out->set_created_unix_ms(info.created_unix_ms);
  out->set_seconds(info.seconds);
  for (const std::string& s : info.shards) out->add_shards(s);
}

inline embedding::CheckpointInfo FromProto(const v1::CheckpointInfo& p) {
  embedding::CheckpointInfo info;
  info.model = p.model();
  info.step = p.step();
  info.rows = p.rows();
  info.bytes = p.bytes();
  info.created_unix_ms = p.created_unix_ms();
  info.seconds = p.seconds();
  info.shards.assign(p.shards().begin(), p.shards().end());
  return info;
}

// A cluster checkpoint's manifest as the coordinator answers it, with the seconds it took.
inline void ToProto(const storage::CheckpointManifest& m, double seconds,
                    v1::CheckpointInfo* out) {
  out->set_model(m.model);
  out->set_step(m.step);
  out->set_rows(m.rows);
  out->set_bytes(m.bytes);
  out->set_created_unix_ms(m.created_unix_ms);
  out->set_seconds(seconds);
  for (const auto& s : m.shards) out->add_shards(s);
  for (const auto& d : m.shard_dirs) out->add_dirs(d);
  for (const auto& t : m.tables) out->add_tables(t);
}

// A restore's checks <-> a RestoreRequest's fields (model, required and expected
// attachments).
inline void ToProto(const embedding::RestoreOptions& o, v1::RestoreRequest* out) {
  out->set_model(o.model);
  out->set_all_models(o.all_models);
  out->set_verify_only(o.verify_only);
  for (const auto& name : o.required_attachments) out->add_required_attachments(name);
  for (const auto& [name, value] : o.expected_attachments) {
    (*out->mutable_expected_attachments())[name] = value;
  }
}

inline embedding::RestoreOptions RestoreOptionsOf(const v1::RestoreRequest& r) {
  embedding::RestoreOptions o;
  o.model = r.model();
  o.all_models = r.all_models();
  o.verify_only = r.verify_only();
  o.required_attachments.assign(r.required_attachments().begin(),
                                r.required_attachments().end());
  for (const auto& [name, value] : r.expected_attachments()) o.expected_attachments[name] = value;
  return o;
}

}  // namespace tessera::wire

#endif  // TESSERA_WIRE_CHECKPOINT_PROTO_H_
