#include "trainer/batch.h"

namespace tessera::trainer {

void Batch::AppendRange(const Batch& other, int begin, int end) {
  const size_t num_dense = other.size > 0 ? other.dense.size() / other.size : 0;
  dense.insert(dense.end(), other.dense.begin() + begin * num_dense,
               other.dense.begin() + end * num_dense);
  labels.insert(labels.end(), other.labels.begin() + begin, other.labels.begin() + end);
  if (!other.teacher_probability.empty()) {
    teacher_probability.insert(teacher_probability.end(), other.teacher_probability.begin() + begin,
                               other.teacher_probability.begin() + end);
  }
  ids.resize(other.ids.size());
  offsets.resize(other.ids.size(), std::vector<int32_t>(1, 0));
  for (size_t f = 0; f < other.ids.size(); ++f) {
    const auto& off = other.offsets[f];
    for (int b = begin; b < end; ++b) {
      ids[f].insert(ids[f].end(), other.ids[f].begin() + off[b], other.ids[f].begin() + off[b + 1]);
      offsets[f].push_back(static_cast<int32_t>(ids[f].size()));
    }
  }
  size += end - begin;
}

}  // namespace tessera::trainer
