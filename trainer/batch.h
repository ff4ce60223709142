#ifndef TESSERA_TRAINER_BATCH_H_
#define TESSERA_TRAINER_BATCH_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::trainer {

// One mini-batch of training samples: dense features, labels, and for each sparse
// feature a CSR list of ids (a bag per sample; one id per bag for Criteo data).
struct Batch {
  int64_t index = 0;                          // position of this batch in its stream
  int size = 0;                               // samples
  std::vector<float> dense;                   // (size, num_dense)
  std::vector<float> labels;                  // (size), 0 or 1
  std::vector<std::vector<int64_t>> ids;      // [feature] -> ids of all bags
  std::vector<std::vector<int32_t>> offsets;  // [feature] -> (size + 1) CSR bag offsets
  std::vector<float> teacher_probability;     // (size) for synthetic data, else empty

  // Empties the batch for `num_sparse` features, keeping capacity.
  void Reset(int num_sparse) {
    size = 0;
    dense.clear();
    labels.clear();
    teacher_probability.clear();
    ids.resize(num_sparse);
    offsets.resize(num_sparse);
    for (auto& v : ids) v.clear();
    for (auto& v : offsets) v.assign(1, 0);
  }

  // Appends samples [begin, end) of `other` (same feature count).
  void AppendRange(const Batch& other, int begin, int end);
};

// A stream of batches.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Fills `batch` with the next batch; false at the end of the data. An error when the
  // data cannot be read (or is malformed and the source stops on bad data).
  virtual absl::StatusOr<bool> Next(Batch* batch) = 0;
};

}  // namespace tessera::trainer

#endif  // TESSERA_TRAINER_BATCH_H_
