// tessera-cli drop.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "embedding/collection.h"
#include "tools/cli/cli.h"

namespace tessera::cli {

int Drop(client::EmbeddingClient& tables, const std::string& table) {
  std::vector<std::string> names;
  const std::string model = absl::GetFlag(FLAGS_model);
  if (!table.empty()) {
    names.push_back(table);
  } else if (!model.empty()) {
    absl::StatusOr<std::vector<tessera::v1::TableConfig>> listed = tables.ListTables();
    if (!listed.ok()) return Fail("drop", listed.status());
    for (const auto& t : *listed) {
      if (tessera::embedding::TableOfModel(t.name(), model)) names.push_back(t.name());
    }
    if (names.empty()) std::printf("model '%s' has no tables\n", model.c_str());
  } else {
    return Refuse("drop needs --table=NAME, or --model=NAME for all its tables");
  }
  for (const std::string& name : names) {
    if (absl::Status s = tables.DropTable(name); !s.ok())
      return Fail(absl::StrCat("drop ", name), s);
    std::printf("dropped table '%s'\n", name.c_str());
  }
  return 0;
}

}  // namespace tessera::cli
