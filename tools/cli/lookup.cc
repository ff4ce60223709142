// tessera-cli lookup.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tools/cli/cli.h"

namespace tessera::cli {

namespace {

// --ids: ids are 64-bit patterns, so an unsigned hash names the int64 of the same bits.
absl::StatusOr<std::vector<int64_t>> ParseIds() {
  std::vector<int64_t> ids;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_ids), ',', absl::SkipEmpty())) {
    int64_t id = 0;
    uint64_t unsigned_id = 0;
    if (absl::SimpleAtoi(part, &id)) {
      ids.push_back(id);
    } else if (absl::SimpleAtoi(part, &unsigned_id)) {
      ids.push_back(static_cast<int64_t>(unsigned_id));
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--ids: bad id '", part, "'"));
    }
  }
  return ids;
}

}  // namespace

int Lookup(client::EmbeddingClient& tables, const std::string& table) {
  if (table.empty() || absl::GetFlag(FLAGS_ids).empty()) {
    return Refuse(
        "lookup needs --table=NAME and --ids=ID,ID,... (read only: "
        "ids never stored show their initial weights)");
  }
  absl::StatusOr<std::vector<int64_t>> ids = ParseIds();
  if (!ids.ok()) {
    return Refuse(ids.status().message());
  }
  absl::StatusOr<tessera::v1::TableConfig> config = tables.Config(table);
  if (!config.ok()) return Fail("lookup", config.status());
  const int dim = config->dim();
  std::vector<float> values(ids->size() * dim);
  embedding::LookupOptions read_only;
  read_only.insert_missing = false;
  if (absl::Status s = tables.Lookup(table, *ids, absl::MakeSpan(values), read_only); !s.ok()) {
    return Fail("lookup", s);
  }
  for (size_t i = 0; i < ids->size(); ++i) {
    std::printf("%lld:", static_cast<long long>((*ids)[i]));
    for (int j = 0; j < dim; ++j) std::printf(" %.6f", values[i * dim + j]);
    std::printf("\n");
  }
  return 0;
}

}  // namespace tessera::cli
