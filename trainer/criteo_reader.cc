#include "trainer/criteo_reader.h"

#include <glob.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status.h"
#include "embedding/sharding.h"

namespace tessera::trainer_internal {

// A text file read line by line. zlib reads gzip-compressed files decompressed and plain
// ones as they are, so both kinds (and a .gz of concatenated members) read the same way.
class TextFile {
 public:
  static absl::StatusOr<std::unique_ptr<TextFile>> Open(const std::string& path) {
    gzFile f = gzopen(path.c_str(), "rb");
    if (f == nullptr) {
      return absl::NotFoundError(absl::StrCat("cannot open Criteo TSV file '", path,
                                              "': ", std::strerror(errno)));
    }
    gzbuffer(f, 1 << 17);
    return std::unique_ptr<TextFile>(new TextFile(f, path));
  }
  ~TextFile() { gzclose(f_); }

  // The next line, without its newline, into *line (cut at kMaxLineBytes + 1 bytes: a
  // longer one is malformed anyway); false at the end. DataLoss for a corrupt or
  // truncated gzip stream.
  absl::StatusOr<bool> ReadLine(std::string* line) {
    line->clear();
    bool any = false;
    while (true) {
      if (pos_ == end_) {
        if (eof_) return any;
        const int n = gzread(f_, buf_.data(), static_cast<unsigned>(buf_.size()));
        int err = Z_OK;
        const char* what = gzerror(f_, &err);
        if (n < 0 || (err != Z_OK && err != Z_STREAM_END)) {
          return WithCause(absl::DataLossError(absl::StrCat(
                               "'", path_, "' is corrupt or truncated (gzip: ", what, ")")),
                           Cause::kInputFile);
        }
        if (n == 0) {
          eof_ = true;
          return any;
        }
        pos_ = 0;
        end_ = static_cast<size_t>(n);
      }
      any = true;
      const char* begin = buf_.data() + pos_;
      const char* nl = static_cast<const char*>(std::memchr(begin, '\n', end_ - pos_));
      const size_t take = (nl != nullptr ? nl : buf_.data() + end_) - begin;
      if (line->size() <= kMaxLineBytes) {
        line->append(begin, std::min(take, kMaxLineBytes + 1 - line->size()));
      }
      pos_ += take;
      if (nl != nullptr) {
        ++pos_;
        return true;
      }
    }
  }

  static constexpr size_t kMaxLineBytes = 1 << 20;

 private:
  TextFile(gzFile f, std::string path) : f_(f), path_(std::move(path)), buf_(1 << 16) {}

  gzFile f_;
  std::string path_;
  std::vector<char> buf_;
  size_t pos_ = 0, end_ = 0;
  bool eof_ = false;
};

}  // namespace tessera::trainer_internal

namespace tessera::trainer {
namespace {

using trainer_internal::TextFile;

using embedding::Mix64;

bool ParseHex(absl::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return false;
    }
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

// A field as a message may quote it: escaped, and cut after 40 bytes.
std::string Printable(absl::string_view field) {
  constexpr size_t kShown = 40;
  std::string out = absl::CHexEscape(field.substr(0, kShown));
  if (field.size() > kShown) absl::StrAppend(&out, "...");
  return out;
}

void AppendSample(const std::vector<float>& dense, const std::vector<int64_t>& ids, float label,
                  Batch* batch) {
  batch->dense.insert(batch->dense.end(), dense.begin(), dense.end());
  batch->labels.push_back(label);
  for (size_t f = 0; f < ids.size(); ++f) {
    batch->ids[f].push_back(ids[f]);
    batch->offsets[f].push_back(static_cast<int32_t>(batch->ids[f].size()));
  }
  ++batch->size;
}

}  // namespace

int64_t CriteoFeatureId(int feature, uint64_t value, bool missing) {
  const uint64_t salt = Mix64(0x63726974656fULL + static_cast<uint64_t>(feature));
  return static_cast<int64_t>(Mix64(salt ^ (missing ? 0x4d495353494e47ULL : Mix64(value + 1))));
}

bool IsHeldOutLine(int64_t line_number, const CriteoOptions& options, int file) {
  if (options.held_out_fraction <= 0.0) return false;
  const uint64_t key = static_cast<uint64_t>(line_number) + (static_cast<uint64_t>(file) << 40);
  const uint64_t h = Mix64(key ^ Mix64(options.seed + 77));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < options.held_out_fraction;
}

absl::Status ParseCriteoLine(absl::string_view line, const CriteoOptions& options, float* dense,
                             int64_t* ids, float* label) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  // A UTF-8 byte order mark (an editor's, at the start of a file) is not part of the label.
  absl::ConsumePrefix(&line, "\xEF\xBB\xBF");
  const int expected = 1 + options.num_dense + options.num_sparse;
  int column = 0;
  size_t start = 0;
  while (true) {
    const size_t tab = line.find('\t', start);
    const absl::string_view field =
        line.substr(start, tab == absl::string_view::npos ? absl::string_view::npos : tab - start);
    if (column >= expected) {
      // A tab after the last column (an exporter's habit) adds no column.
      if (column == expected && field.empty() && tab == absl::string_view::npos) break;
      return absl::InvalidArgumentError(
          absl::StrCat("more than ", expected, " tab-separated columns"));
    }
    if (column == 0) {
      if (field == "0") {
        *label = 0.0f;
      } else if (field == "1") {
        *label = 1.0f;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("label must be 0 or 1, got '", Printable(field), "'"));
      }
    } else if (column <= options.num_dense) {
      int64_t v = 0;
      if (field.empty()) {
        dense[column - 1] = 0.0f;
      } else if (absl::SimpleAtoi(field, &v)) {
        dense[column - 1] =
            static_cast<float>(std::log1p(static_cast<double>(std::max<int64_t>(v, 0))));
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "integer column I", column, " is not an integer: '", Printable(field), "'"));
      }
    } else {
      const int f = column - 1 - options.num_dense;
      uint64_t v = 0;
      if (field.empty()) {
        ids[f] = CriteoFeatureId(f, 0, /*missing=*/true);
      } else if (ParseHex(field, &v)) {
        ids[f] = CriteoFeatureId(f, v, /*missing=*/false);
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "categorical column C", f + 1, " is not hexadecimal: '", Printable(field), "'"));
      }
    }
    ++column;
    if (tab == absl::string_view::npos) break;
    start = tab + 1;
  }
  if (column != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", expected, " tab-separated columns, got ", column));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ExpandDataPaths(const std::string& spec) {
  std::vector<std::string> paths;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    const std::string pattern(part);
    if (pattern.find_first_of("*?[") == std::string::npos) {
      paths.push_back(pattern);
      continue;
    }
    glob_t g;
    const int rc = glob(pattern.c_str(), 0, nullptr, &g);
    if (rc != 0) {
      if (rc == GLOB_NOMATCH) {
        return absl::NotFoundError(absl::StrCat("data pattern '", pattern, "' matches no file"));
      }
      return absl::InvalidArgumentError(absl::StrCat("cannot expand data pattern '", pattern, "'"));
    }
    for (size_t i = 0; i < g.gl_pathc; ++i) paths.push_back(g.gl_pathv[i]);  // sorted
    globfree(&g);
  }
  if (paths.empty()) return absl::InvalidArgumentError("no data file given");
  return paths;
}

absl::StatusOr<std::unique_ptr<CriteoReader>> CriteoReader::Open(const std::string& spec,
                                                                 const CriteoOptions& options,
                                                                 int batch_size) {
  if (batch_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("batch size must be > 0, got ", batch_size));
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::string> paths, ExpandDataPaths(spec));
  for (const std::string& path : paths) {
    // Every file opens now: a typo in the third file is not found an hour in.
    TESSERA_RETURN_IF_ERROR(TextFile::Open(path).status());
  }
  std::unique_ptr<CriteoReader> r(new CriteoReader(std::move(paths), options, batch_size));
  TESSERA_RETURN_IF_ERROR(r->OpenFile());
  return r;
}

CriteoReader::CriteoReader(std::vector<std::string> paths, const CriteoOptions& options,
                           int batch_size)
    : paths_(std::move(paths)), options_(options), batch_size_(batch_size) {}

CriteoReader::~CriteoReader() = default;

absl::Status CriteoReader::OpenFile() {
  TESSERA_ASSIGN_OR_RETURN(in_, TextFile::Open(paths_[file_]));
  line_number_ = 0;
  return absl::OkStatus();
}

absl::StatusOr<bool> CriteoReader::ReadSample(bool held_out, float* dense, int64_t* ids,
                                              float* label) {
  while (true) {
    TESSERA_ASSIGN_OR_RETURN(bool got, in_->ReadLine(&line_));
    if (!got) {
      if (file_ + 1 < static_cast<int>(paths_.size())) {
        ++file_;
      } else {
        if (held_out || ++epoch_ >= options_.epochs || lines_this_epoch_ == 0) return false;
        file_ = 0;
        lines_this_epoch_ = 0;
      }
      TESSERA_RETURN_IF_ERROR(OpenFile());
      continue;
    }
    ++line_number_;
    ++lines_this_epoch_;
    const bool line_held_out = IsHeldOutLine(line_number_, options_, file_);
    // Another data-parallel worker's training line.
    if (!held_out && !line_held_out && options_.num_workers > 1 &&
        (line_number_ - 1) % options_.num_workers != options_.worker_index) {
      continue;
    }
    // The held-out pass runs first; stopping at a bad line, it checks the training lines
    // it passes too, so the first bad line of the file is the one named.
    const bool check_only = line_held_out != held_out;
    if (check_only && !(held_out && options_.stop_on_bad_line)) continue;
    if (!check_only) {
      if (held_out) {
        if (held_out_report_ != nullptr) ++held_out_report_->lines_read;
      } else {
        lines_read_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    absl::Status s =
        line_.size() > TextFile::kMaxLineBytes
            ? absl::InvalidArgumentError(absl::StrCat("line longer than ",
                                                      TextFile::kMaxLineBytes, " bytes"))
            : ParseCriteoLine(line_, options_, dense, ids, label);
    if (s.ok()) {
      if (check_only) continue;
      return true;
    }
    const std::string where =
        absl::StrCat(paths_[file_], ":", line_number_, ": ", s.message());
    if (options_.stop_on_bad_line) return absl::InvalidArgumentError(where);
    if (held_out) {
      if (held_out_report_ == nullptr) continue;
      // Named like the training lines: the first few, with file and line number.
      if (++held_out_report_->bad_lines <= options_.max_reported_bad_lines) {
        std::cerr << "criteo: skipping malformed held-out line " << where << "\n";
      }
      continue;
    }
    const int64_t bad = bad_lines_.fetch_add(1, std::memory_order_relaxed) + 1;
    // Later epochs read the same lines: each is reported once.
    if (epoch_ == 0 && bad <= options_.max_reported_bad_lines) {
      std::cerr << "criteo: skipping malformed line " << where << "\n";
    }
  }
}

absl::StatusOr<bool> CriteoReader::Next(Batch* batch) {
  const int nd = options_.num_dense;
  const int ns = options_.num_sparse;
  batch->Reset(ns);
  batch->index = batches_;
  std::vector<float> dense(nd);
  std::vector<int64_t> ids(ns);
  float label = 0.0f;
  while (batch->size < batch_size_) {
    absl::StatusOr<bool> got = ReadSample(/*held_out=*/false, dense.data(), ids.data(), &label);
    if (!got.ok()) return got.status();
    if (!*got) break;
    AppendSample(dense, ids, label, batch);
  }
  if (batch->size == 0) return false;
  ++batches_;
  return true;
}

absl::StatusOr<Batch> CriteoReader::LoadHeldOut(const std::string& spec,
                                                const CriteoOptions& options,
                                                HeldOutReport* report) {
  CriteoOptions one_pass = options;
  one_pass.epochs = 1;
  absl::StatusOr<std::unique_ptr<CriteoReader>> r = Open(spec, one_pass, 1);
  if (!r.ok()) return r.status();
  HeldOutReport local;
  (*r)->held_out_report_ = report != nullptr ? report : &local;
  Batch out;
  out.Reset(options.num_sparse);
  std::vector<float> dense(options.num_dense);
  std::vector<int64_t> ids(options.num_sparse);
  float label = 0.0f;
  while (out.size < options.max_held_out) {
    absl::StatusOr<bool> got =
        (*r)->ReadSample(/*held_out=*/true, dense.data(), ids.data(), &label);
    if (!got.ok()) return got.status();
    if (!*got) break;
    AppendSample(dense, ids, label, &out);
  }
  return out;
}

}  // namespace tessera::trainer
