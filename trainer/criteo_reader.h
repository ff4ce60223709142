#ifndef TESSERA_TRAINER_CRITEO_READER_H_
#define TESSERA_TRAINER_CRITEO_READER_H_

#include <atomic>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainer/batch.h"

namespace tessera::trainer {

// Reading the Criteo display-advertising TSV format: label, 13 integer columns and 26
// hexadecimal categorical columns, tab-separated; any feature may be empty.
struct CriteoOptions {
  int num_dense = 13;               // integer columns
  int num_sparse = 26;              // categorical columns
  bool stop_on_bad_line = false;    // false: skip malformed lines and count them
  int max_reported_bad_lines = 10;  // malformed lines printed to stderr with their number
  double held_out_fraction = 0.1;   // share of lines (chosen by a hash of the line number)
  int64_t max_held_out = 200000;    // cap on held-out samples loaded for evaluation
  int epochs = 1;                   // passes over the file
  uint64_t seed = 1;                // picks the held-out lines
};

// Parses one line into `dense` (num_dense: log(1 + max(x, 0)), empty = 0), `ids`
// (num_sparse: the hex value hashed with the feature index; empty maps to a per-feature
// "missing" id) and `label`. InvalidArgument says what is wrong with the line.
absl::Status ParseCriteoLine(absl::string_view line, const CriteoOptions& options, float* dense,
                             int64_t* ids, float* label);

// The id a categorical value of `feature` maps to (`missing` for an empty field).
int64_t CriteoFeatureId(int feature, uint64_t value, bool missing);

// True when line `line_number` (1-based) belongs to the held-out split.
bool IsHeldOutLine(int64_t line_number, const CriteoOptions& options);

// Streams training batches from a Criteo TSV file, skipping held-out lines. Malformed
// lines are reported to stderr (the first few, with line numbers) and skipped, or stop
// the stream with InvalidArgument naming the line, as options say. One consumer thread.
class CriteoReader final : public BatchSource {
 public:
  static absl::StatusOr<std::unique_ptr<CriteoReader>> Open(const std::string& path,
                                                            const CriteoOptions& options,
                                                            int batch_size);

  absl::StatusOr<bool> Next(Batch* batch) override;

  int64_t lines_read() const { return lines_read_.load(); }
  int64_t bad_lines() const { return bad_lines_.load(); }

  // Loads the held-out lines of `path` (up to options.max_held_out), skipping malformed
  // ones (or failing on them when stop_on_bad_line).
  static absl::StatusOr<Batch> LoadHeldOut(const std::string& path, const CriteoOptions& options);

 private:
  CriteoReader(const std::string& path, const CriteoOptions& options, int batch_size);

  // Reads the next well-formed line of the wanted split; false at end of file.
  absl::StatusOr<bool> ReadSample(bool held_out, float* dense, int64_t* ids, float* label);

  std::string path_;
  CriteoOptions options_;
  int batch_size_;
  std::ifstream in_;
  int epoch_ = 0;
  int64_t line_number_ = 0;
  int64_t batches_ = 0;
  std::string line_;
  std::atomic<int64_t> lines_read_{0};
  std::atomic<int64_t> bad_lines_{0};
};

}  // namespace tessera::trainer

#endif  // TESSERA_TRAINER_CRITEO_READER_H_
