// tessera-cli import.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "tools/cli/cli.h"
#include "tools/npz.h"

namespace tessera::cli {

namespace {

using tessera::tools::NpyArray;

// Array `name` of `arrays`, which must be of `dtype` and `rank` when there; null when not.
absl::StatusOr<const NpyArray*> Find(const std::map<std::string, NpyArray>& arrays,
                                     const std::string& name, const std::string& dtype,
                                     size_t rank) {
  auto it = arrays.find(name);
  if (it == arrays.end()) return nullptr;
  if (it->second.dtype != dtype || it->second.shape.size() != rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("array '", name, "' must be ", dtype, " of rank ", rank));
  }
  return &it->second;
}

// Rows [begin, begin + count) of `a` (`width` values a row) into `out`; nothing when `a`
// is null.
template <typename T>
void CopyRows(const NpyArray* a, int64_t width, int64_t begin, int64_t count, std::vector<T>* out) {
  if (a == nullptr) return;
  out->resize(count * width);
  std::memcpy(out->data(), a->data.data() + begin * width * sizeof(T), out->size() * sizeof(T));
}

// The arrays of an .npz file as tessera-cli export writes them (ids and weights; state,
// last_step and update_count when there), checked for types and one row per id.
struct Rows {
  const NpyArray* ids = nullptr;
  const NpyArray* weights = nullptr;
  const NpyArray* state = nullptr;
  const NpyArray* last_steps = nullptr;
  const NpyArray* update_counts = nullptr;
};

absl::StatusOr<Rows> RowsOf(const std::map<std::string, NpyArray>& arrays,
                            const std::string& path) {
  Rows r;
  TESSERA_ASSIGN_OR_RETURN(r.ids, Find(arrays, "ids", "<i8", 1));
  TESSERA_ASSIGN_OR_RETURN(r.weights, Find(arrays, "weights", "<f4", 2));
  if (r.ids == nullptr || r.weights == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(path, " needs arrays 'ids' and 'weights'"));
  }
  TESSERA_ASSIGN_OR_RETURN(r.state, Find(arrays, "state", "<f4", 2));
  TESSERA_ASSIGN_OR_RETURN(r.last_steps, Find(arrays, "last_step", "<i8", 1));
  TESSERA_ASSIGN_OR_RETURN(r.update_counts, Find(arrays, "update_count", "<i8", 1));
  const int64_t n = r.ids->shape[0];
  for (const NpyArray* a : {r.weights, r.state, r.last_steps, r.update_counts}) {
    if (a != nullptr && a->shape[0] != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("every array must have one row per id (", n, ")"));
    }
  }
  return r;
}

}  // namespace

int Import(client::EmbeddingClient& tables, const std::string& table) {
  const std::string in = absl::GetFlag(FLAGS_in);
  if (table.empty() || in.empty()) return Refuse("import needs --table=NAME and --in=FILE.npz");
  absl::StatusOr<std::map<std::string, NpyArray>> arrays = tessera::tools::ReadNpz(in);
  absl::StatusOr<Rows> rows = arrays.ok() ? RowsOf(*arrays, in) : arrays.status();
  if (!rows.ok()) {
    return Refuse(absl::StrCat("import: ", rows.status().message()));
  }
  const int64_t n = rows->ids->shape[0];
  embedding::RowBlock block;
  block.dim = static_cast<int>(rows->weights->shape[1]);
  block.state_floats = rows->state != nullptr ? static_cast<int>(rows->state->shape[1]) : 0;
  constexpr int64_t kRows = 1 << 16;  // rows per request
  for (int64_t begin = 0; begin < n; begin += kRows) {
    const int64_t count = std::min(kRows, n - begin);
    CopyRows(rows->ids, 1, begin, count, &block.ids);
    CopyRows(rows->weights, block.dim, begin, count, &block.weights);
    CopyRows(rows->state, block.state_floats, begin, count, &block.state);
    CopyRows(rows->last_steps, 1, begin, count, &block.last_steps);
    CopyRows(rows->update_counts, 1, begin, count, &block.update_counts);
    if (absl::Status s = tables.ImportRows(table, block); !s.ok()) {
      return Fail(absl::StrCat("import (", begin, " of ", n, " rows stored before this)"), s);
    }
  }
  std::printf("imported %lld rows into table '%s' (dim %d%s)\n", static_cast<long long>(n),
              table.c_str(), block.dim, rows->state != nullptr ? ", with optimizer state" : "");
  return 0;
}

}  // namespace tessera::cli
