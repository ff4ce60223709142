#include "trainer/criteo_reader.h"

#include <cmath>
#include <iostream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "embedding/sharding.h"

namespace tessera::trainer {
namespace {

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

bool IsHeldOutLine(int64_t line_number, const CriteoOptions& options) {
  if (options.held_out_fraction <= 0.0) return false;
  const uint64_t h = Mix64(static_cast<uint64_t>(line_number) ^ Mix64(options.seed + 77));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < options.held_out_fraction;
}

absl::Status ParseCriteoLine(absl::string_view line, const CriteoOptions& options, float* dense,
                             int64_t* ids, float* label) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const int expected = 1 + options.num_dense + options.num_sparse;
  int column = 0;
  size_t start = 0;
  while (true) {
    const size_t tab = line.find('\t', start);
    const absl::string_view field =
        line.substr(start, tab == absl::string_view::npos ? absl::string_view::npos : tab - start);
    if (column >= expected) {
      return absl::InvalidArgumentError(
          absl::StrCat("more than ", expected, " tab-separated columns"));
    }
    if (column == 0) {
      if (field == "0") {
        *label = 0.0f;
      } else if (field == "1") {
        *label = 1.0f;
      } else {
        return absl::InvalidArgumentError(absl::StrCat("label must be 0 or 1, got '", field, "'"));
      }
    } else if (column <= options.num_dense) {
      int64_t v = 0;
      if (field.empty()) {
        dense[column - 1] = 0.0f;
      } else if (absl::SimpleAtoi(field, &v)) {
        dense[column - 1] =
            static_cast<float>(std::log1p(static_cast<double>(std::max<int64_t>(v, 0))));
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("integer column I", column, " is not an integer: '", field, "'"));
      }
    } else {
      const int f = column - 1 - options.num_dense;
      uint64_t v = 0;
      if (field.empty()) {
        ids[f] = CriteoFeatureId(f, 0, /*missing=*/true);
      } else if (ParseHex(field, &v)) {
        ids[f] = CriteoFeatureId(f, v, /*missing=*/false);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("categorical column C", f + 1, " is not hexadecimal: '", field, "'"));
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

absl::StatusOr<std::unique_ptr<CriteoReader>> CriteoReader::Open(const std::string& path,
                                                                 const CriteoOptions& options,
                                                                 int batch_size) {
  if (batch_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("batch size must be > 0, got ", batch_size));
  }
  std::unique_ptr<CriteoReader> r(new CriteoReader(path, options, batch_size));
  if (!r->in_.is_open()) {
    return absl::NotFoundError(absl::StrCat("cannot open Criteo TSV file '", path, "'"));
  }
  return r;
}

CriteoReader::CriteoReader(const std::string& path, const CriteoOptions& options, int batch_size)
    : path_(path), options_(options), batch_size_(batch_size), in_(path) {}

absl::StatusOr<bool> CriteoReader::ReadSample(bool held_out, float* dense, int64_t* ids,
                                              float* label) {
  while (true) {
    if (!std::getline(in_, line_)) {
      if (in_.bad()) return absl::DataLossError(absl::StrCat("read error in '", path_, "'"));
      if (held_out || ++epoch_ >= options_.epochs) return false;
      if (line_number_ == 0) return false;
      in_.clear();
      in_.seekg(0);
      line_number_ = 0;
      continue;
    }
    ++line_number_;
    if (IsHeldOutLine(line_number_, options_) != held_out) continue;
    if (!held_out) lines_read_.fetch_add(1, std::memory_order_relaxed);
    absl::Status s = ParseCriteoLine(line_, options_, dense, ids, label);
    if (s.ok()) return true;
    const std::string where = absl::StrCat(path_, ":", line_number_, ": ", s.message());
    if (options_.stop_on_bad_line) return absl::InvalidArgumentError(where);
    const int64_t bad = bad_lines_.fetch_add(1, std::memory_order_relaxed) + 1;
    if (bad <= options_.max_reported_bad_lines) {
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

absl::StatusOr<Batch> CriteoReader::LoadHeldOut(const std::string& path,
                                                const CriteoOptions& options) {
  CriteoOptions one_pass = options;
  one_pass.epochs = 1;
  absl::StatusOr<std::unique_ptr<CriteoReader>> r = Open(path, one_pass, 1);
  if (!r.ok()) return r.status();
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
