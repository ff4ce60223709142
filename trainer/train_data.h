#ifndef TESSERA_TRAINER_TRAIN_DATA_H_
#define TESSERA_TRAINER_TRAIN_DATA_H_

// tessera-train's input: synthetic batches or TSV files, from any step on.

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "trainer/batch.h"
#include "trainer/criteo_reader.h"
#include "trainer/input_pipeline.h"
#include "trainer/synthetic.h"
#include "trainer/train_flags.h"

namespace tessera::trainer {

// A run's input: the held-out batch and the training batches from any step on. Members
// are destroyed in reverse order: the source (whose threads read the others) first.
struct TrainData {
  std::unique_ptr<SyntheticGenerator> generator;
  std::unique_ptr<CriteoReader> opened;  // the first TSV reader, checked at start-up
  CriteoReader* reader = nullptr;        // the TSV reader in use (owned by the source)
  Batch held_out;
  // The batches from step `first` on: a resumed run, or one that went back to a checkpoint
  // after a shard restart, reads what it read then.
  std::function<absl::StatusOr<std::unique_ptr<BatchSource>>(int64_t)> make_source;
  std::unique_ptr<BatchSource> source;
};

// The synthetic data of `f`: a generator, its held-out batch and its sources.
absl::Status OpenSyntheticData(const TrainFlags& f, TrainData* d);
// The TSV files of `f`: the held-out split, read first, and readers from any step on.
absl::Status OpenFileData(const TrainFlags& f, TrainData* d);
// --vocabulary=hashed: the held-out batch and every batch of the sources hashed.
void HashData(const TrainFlags& f, TrainData* d);

}  // namespace tessera::trainer

#endif  // TESSERA_TRAINER_TRAIN_DATA_H_
