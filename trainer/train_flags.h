#ifndef TESSERA_TRAINER_TRAIN_FLAGS_H_
#define TESSERA_TRAINER_TRAIN_FLAGS_H_

// tessera-train's flags, parsed and checked once into TrainFlags before anything starts.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "client/embedding_client.h"
#include "trainer/criteo_reader.h"
#include "trainer/data_parallel.h"
#include "trainer/dense_backend.h"
#include "trainer/synthetic.h"
#include "trainer/trainer.h"

ABSL_DECLARE_FLAG(int64_t, memory_limit);
ABSL_DECLARE_FLAG(int64_t, checkpoint_every);
ABSL_DECLARE_FLAG(std::string, resume);
ABSL_DECLARE_FLAG(std::string, model);

namespace tessera::trainer {

// Every flag of a run, parsed and checked once, before anything starts.
struct TrainFlags {
  std::string data;  // "synthetic" or TSV paths
  bool synthetic = true;
  int batch_size = 0;
  uint64_t seed = 0;
  int64_t steps = 0;  // 0: the default length (synthetic) or the whole input (TSV)
  DlrmConfig model;
  std::string dense_optimizer;
  std::string backend;
  int cuda_device = 0;
  std::string coordinator;     // empty: the tables live in this process
  std::string data_dir;        // in process: where the tables are kept; empty: memory only
  int shards = 0;              // in process
  bool device_tables = false;  // --shards=cuda
  int keep_checkpoints = 0;
  std::string client_mode;       // with --coordinator
  client::ClientOptions client;  // with --coordinator
  v1::TableConfig table;         // every table's settings (the trainer names each)
  TrainerOptions options;        // on_progress and data_parallel are set later
  bool resume = false;
  int num_workers = 1;
  int worker = 0;
  DataParallelOptions data_parallel;  // with --num_workers > 1
  SyntheticConfig synthetic_data;     // synthetic
  // --vocabulary=hashed: each feature's cardinality (ids are taken modulo it); else empty.
  std::vector<int64_t> vocabulary;
  int64_t held_out = 0;  // synthetic: held-out samples
  CriteoOptions criteo;  // TSV
  int reader_threads = 1;
  int prefetch = 8;
  int sparse_threads = 1;  // resolved: 0 became the CPU count
};

// Every flag, checked (ranges, combinations) and parsed; InvalidArgument names the flag.
absl::StatusOr<TrainFlags> ParseTrainFlags();

}  // namespace tessera::trainer

#endif  // TESSERA_TRAINER_TRAIN_FLAGS_H_
