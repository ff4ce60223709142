#ifndef TESSERA_TRAINER_DENSE_SNAPSHOT_H_
#define TESSERA_TRAINER_DENSE_SNAPSHOT_H_

// A trainer's dense network published for serving replicas through a key-value store (the
// coordinator's): a header under DenseKey(model) and the parameters in parts under keys of
// one of two slots, written before the header that names them, so that a reader never
// takes parts of two publications (their checksum would not match).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/v1/serving.pb.h"
#include "trainer/data_parallel.h"
#include "trainer/dense_backend.h"

namespace tessera::trainer {

// Bytes of parameters a store value holds (the coordinator's store takes 1 MiB).
inline constexpr size_t kDensePartBytes = size_t{512} << 10;

// The header's key: "serving/<model>/dense".
std::string DenseKey(const std::string& model);
// Part `part` of slot `slot`: "serving/<model>/dense.<slot>.<part>".
std::string DensePartKey(const std::string& model, int slot, int part);

// Publishes a trainer's dense network for model `model`, whose sparse features read
// `tables` in order. Not thread-safe: the training thread publishes.
class DensePublisher {
 public:
  DensePublisher(RendezvousKv* kv, std::string model, std::vector<std::string> tables)
      : kv_(kv), model_(std::move(model)), tables_(std::move(tables)) {}

  // Publishes `dense`'s parameters as those after `step` training steps.
  absl::Status Publish(int64_t step, DenseBackend& dense);
  int64_t published() const { return published_; }

 private:
  RendezvousKv* const kv_;
  const std::string model_;
  const std::vector<std::string> tables_;
  int64_t published_ = 0;  // publications made; the slot alternates with it
};

// The name of the attachment that holds a checkpoint's DenseSnapshot (parameters inline): a
// serving replica of a checkpoint (tessera-serve --checkpoint) scores with it.
inline constexpr char kServingAttachment[] = "serving";

// `dense`'s network after `step` steps, for features reading `tables` in order: its shape,
// its parameters (inline, with their checksum; parts and slot unset).
v1::DenseSnapshot DenseSnapshotOf(int64_t step, DenseBackend& dense,
                                  const std::vector<std::string>& tables);
// A snapshot DenseSnapshotOf made, read back: DataLoss unless it parses and its parameters
// match their count and checksum.
absl::StatusOr<v1::DenseSnapshot> ParseDenseSnapshot(const std::string& bytes);

// The DlrmConfig a snapshot's network has (its shape; the rest is the defaults').
DlrmConfig ConfigOf(const v1::DenseSnapshot& snapshot);

// The newest snapshot of `model` in `kv`, with its parameters, when its step is newer than
// `newer_than`: nullopt when none is published, none is newer, or a publication replaced
// the slot while it was read (read again later). DataLoss for values that do not parse.
absl::StatusOr<std::optional<v1::DenseSnapshot>> ReadDenseSnapshot(RendezvousKv& kv,
                                                                   const std::string& model,
                                                                   int64_t newer_than);

}  // namespace tessera::trainer

#endif  // TESSERA_TRAINER_DENSE_SNAPSHOT_H_
