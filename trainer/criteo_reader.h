#ifndef TESSERA_TRAINER_CRITEO_READER_H_
#define TESSERA_TRAINER_CRITEO_READER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainer/batch.h"

namespace tessera::trainer_internal {
class TextFile;
}  // namespace tessera::trainer_internal

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
  // Data-parallel workers: worker i of N trains on the lines whose (1-based) line number
  // of their file is i + 1 modulo N; every worker holds out the same lines.
  int num_workers = 1;
  int worker_index = 0;
};

// Parses one line into `dense` (num_dense: log(1 + max(x, 0)), empty = 0), `ids`
// (num_sparse: the hex value hashed with the feature index; empty maps to a per-feature
// "missing" id) and `label`. InvalidArgument says what is wrong with the line.
absl::Status ParseCriteoLine(absl::string_view line, const CriteoOptions& options, float* dense,
                             int64_t* ids, float* label);

// The id a categorical value of `feature` maps to (`missing` for an empty field).
int64_t CriteoFeatureId(int feature, uint64_t value, bool missing);

// True when line `line_number` (1-based) of the `file`th input file (0-based) belongs to
// the held-out split.
bool IsHeldOutLine(int64_t line_number, const CriteoOptions& options, int file = 0);

// The files a --data value names: comma-separated paths, each a path or a glob pattern
// (sorted matches). InvalidArgument for an empty list, NotFound for a pattern that matches
// nothing.
absl::StatusOr<std::vector<std::string>> ExpandDataPaths(const std::string& spec);

// What loading the held-out split found.
struct HeldOutReport {
  int64_t lines_read = 0;  // held-out lines read
  int64_t bad_lines = 0;   // of them malformed (skipped)
};

// Streams training batches from Criteo TSV files (plain or gzip-compressed, one after
// the other; `spec` as ExpandDataPaths takes it), skipping held-out lines. Malformed lines
// are reported to stderr in the first epoch (the first few, with file and line number)
// and skipped, or stop the stream with InvalidArgument naming the line, as options say.
// One consumer thread.
class CriteoReader final : public BatchSource {
 public:
  static absl::StatusOr<std::unique_ptr<CriteoReader>> Open(const std::string& spec,
                                                            const CriteoOptions& options,
                                                            int batch_size);
  ~CriteoReader() override;

  absl::StatusOr<bool> Next(Batch* batch) override;

  int64_t lines_read() const { return lines_read_.load(); }
  int64_t bad_lines() const { return bad_lines_.load(); }
  const std::vector<std::string>& paths() const { return paths_; }

  // Loads the held-out lines of `spec` (up to options.max_held_out), skipping malformed
  // ones and counting them in `report` (may be null). With stop_on_bad_line it checks every
  // line it passes, of both splits, and fails on the first malformed one in file order.
  static absl::StatusOr<Batch> LoadHeldOut(const std::string& spec, const CriteoOptions& options,
                                           HeldOutReport* report = nullptr);

 private:
  CriteoReader(std::vector<std::string> paths, const CriteoOptions& options, int batch_size);

  // Opens file `file_` (from its start).
  absl::Status OpenFile();
  // Reads the next well-formed line of the wanted split; false at the end of the input.
  absl::StatusOr<bool> ReadSample(bool held_out, float* dense, int64_t* ids, float* label);

  std::vector<std::string> paths_;
  CriteoOptions options_;
  int batch_size_;
  std::unique_ptr<trainer_internal::TextFile> in_;
  int file_ = 0;
  int epoch_ = 0;
  int64_t line_number_ = 0;  // in the current file
  int64_t lines_this_epoch_ = 0;
  int64_t batches_ = 0;
  std::string line_;
  std::atomic<int64_t> lines_read_{0};
  std::atomic<int64_t> bad_lines_{0};
  HeldOutReport* held_out_report_ = nullptr;
};

}  // namespace tessera::trainer

#endif  // TESSERA_TRAINER_CRITEO_READER_H_
