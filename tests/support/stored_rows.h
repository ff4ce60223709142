#ifndef TESSERA_TESTS_SUPPORT_STORED_ROWS_H_
#define TESSERA_TESTS_SUPPORT_STORED_ROWS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "embedding/collection.h"
#include "gtest/gtest.h"

namespace tessera::testing {

// Rows by id, each its weights followed by its optimizer state: what tests compare.
using RowMap = std::map<int64_t, std::vector<float>>;

// The rows of `b` as a RowMap.
inline void AddRows(const embedding::RowBlock& b, RowMap* out) {
  for (size_t i = 0; i < b.size(); ++i) {
    std::vector<float>& row = (*out)[b.ids[i]];
    row.assign(b.weights.begin() + i * b.dim, b.weights.begin() + (i + 1) * b.dim);
    row.insert(row.end(), b.state.begin() + i * b.state_floats,
               b.state.begin() + (i + 1) * b.state_floats);
  }
}

inline RowMap RowsOf(const embedding::RowBlock& b) {
  RowMap out;
  AddRows(b, &out);
  return out;
}

// Every stored row of `table` in `c` (ExportRows with state); an export error fails the
// calling test.
inline RowMap StoredRows(embedding::EmbeddingCollection& c, const std::string& table) {
  RowMap out;
  embedding::ExportOptions options;
  options.with_state = true;
  const absl::Status s = c.ExportRows(table, options, [&](const embedding::RowBlock& b) {
    AddRows(b, &out);
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_SUPPORT_STORED_ROWS_H_
