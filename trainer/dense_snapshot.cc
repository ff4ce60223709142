#include "trainer/dense_snapshot.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/crc32c.h"
#include "base/status.h"

namespace tessera::trainer {

std::string DenseKey(const std::string& model) { return absl::StrCat("serving/", model, "/dense"); }

std::string DensePartKey(const std::string& model, int slot, int part) {
  return absl::StrCat(DenseKey(model), ".", slot, ".", part);
}

v1::DenseSnapshot DenseSnapshotOf(int64_t step, DenseBackend& dense,
                                  const std::vector<std::string>& tables) {
  const absl::Span<const float> params = dense.Parameters();
  const DlrmConfig& config = dense.config();
  v1::DenseSnapshot snapshot;
  snapshot.set_step(step);
  snapshot.set_num_dense(config.num_dense);
  snapshot.set_emb_dim(config.emb_dim);
  for (int w : config.bottom_mlp) snapshot.add_bottom_mlp(w);
  for (int w : config.top_mlp) snapshot.add_top_mlp(w);
  for (const std::string& t : tables) snapshot.add_tables(t);
  snapshot.set_parameter_floats(static_cast<int64_t>(params.size()));
  snapshot.set_parameters(reinterpret_cast<const char*>(params.data()),
                          params.size() * sizeof(float));
  snapshot.set_checksum(base::Crc32c(snapshot.parameters().data(), snapshot.parameters().size()));
  return snapshot;
}

absl::StatusOr<v1::DenseSnapshot> ParseDenseSnapshot(const std::string& bytes) {
  v1::DenseSnapshot snapshot;
  if (!snapshot.ParseFromString(bytes) || snapshot.parameter_floats() < 0 ||
      snapshot.parameters().size() !=
          static_cast<size_t>(snapshot.parameter_floats()) * sizeof(float) ||
      base::Crc32c(snapshot.parameters().data(), snapshot.parameters().size()) !=
          snapshot.checksum()) {
    return absl::DataLossError("a damaged dense snapshot (its parameters fail their checksum)");
  }
  return snapshot;
}

absl::Status DensePublisher::Publish(int64_t step, DenseBackend& dense) {
  v1::DenseSnapshot header = DenseSnapshotOf(step, dense, tables_);
  const std::string params = std::move(*header.mutable_parameters());
  header.clear_parameters();
  const size_t bytes = params.size();
  header.set_parts(
      static_cast<int32_t>(std::max<size_t>(1, (bytes + kDensePartBytes - 1) / kDensePartBytes)));
  header.set_slot(static_cast<int32_t>(published_ % 2));
  for (int p = 0; p < header.parts(); ++p) {
    const size_t begin = p * kDensePartBytes;
    v1::DenseSnapshot part;
    part.set_step(step);
    part.set_parameters(params.data() + begin, std::min(kDensePartBytes, bytes - begin));
    TESSERA_RETURN_IF_ERROR(
        kv_->Set(DensePartKey(model_, header.slot(), p), part.SerializeAsString()));
  }
  TESSERA_RETURN_IF_ERROR(kv_->Set(DenseKey(model_), header.SerializeAsString()));
  ++published_;
  return absl::OkStatus();
}

DlrmConfig ConfigOf(const v1::DenseSnapshot& snapshot) {
  DlrmConfig config;
  config.num_dense = snapshot.num_dense();
  config.num_sparse = snapshot.tables_size();
  config.emb_dim = snapshot.emb_dim();
  config.bottom_mlp.assign(snapshot.bottom_mlp().begin(), snapshot.bottom_mlp().end());
  config.top_mlp.assign(snapshot.top_mlp().begin(), snapshot.top_mlp().end());
  return config;
}

absl::StatusOr<std::optional<v1::DenseSnapshot>> ReadDenseSnapshot(RendezvousKv& kv,
                                                                   const std::string& model,
                                                                   int64_t newer_than) {
  // A store without the key waits the timeout: the shortest.
  absl::StatusOr<std::vector<std::string>> got =
      kv.Get({DenseKey(model)}, std::chrono::milliseconds(1));
  if (absl::IsDeadlineExceeded(got.status())) return std::nullopt;
  TESSERA_RETURN_IF_ERROR(got.status());
  v1::DenseSnapshot header;
  if (!header.ParseFromString((*got)[0])) {
    return absl::DataLossError(absl::StrCat("'", DenseKey(model), "' holds no dense snapshot"));
  }
  if (header.step() <= newer_than) return std::nullopt;
  if (header.parts() < 1 || header.parts() > 4096 || header.parameter_floats() < 0 ||
      (header.slot() != 0 && header.slot() != 1)) {
    return absl::DataLossError(absl::StrCat("'", DenseKey(model), "': a malformed header"));
  }
  std::vector<std::string> keys;
  for (int p = 0; p < header.parts(); ++p) keys.push_back(DensePartKey(model, header.slot(), p));
  got = kv.Get(keys, std::chrono::milliseconds(1));
  if (absl::IsDeadlineExceeded(got.status())) return std::nullopt;
  TESSERA_RETURN_IF_ERROR(got.status());
  std::string params;
  for (const std::string& value : *got) {
    v1::DenseSnapshot part;
    if (!part.ParseFromString(value)) {
      return absl::DataLossError(absl::StrCat("'", DenseKey(model), "': a malformed part"));
    }
    // A part of another publication: the slot is being written again.
    if (part.step() != header.step()) return std::nullopt;
    params += part.parameters();
  }
  if (params.size() != static_cast<size_t>(header.parameter_floats()) * sizeof(float) ||
      base::Crc32c(params.data(), params.size()) != header.checksum()) {
    return std::nullopt;
  }
  header.set_parameters(std::move(params));
  return header;
}

}  // namespace tessera::trainer
