// tessera-cli apply.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "embedding/dtype.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "tools/cli/cli.h"

namespace tessera::cli {

// Creates every table of --tables_file; a table that exists with the same config is left
// as it is, one with another config is an error (nothing is changed).
int Apply(client::EmbeddingClient& tables, const std::string&) {
  const std::string path = absl::GetFlag(FLAGS_tables_file);
  std::ifstream in(path);
  if (path.empty() || !in) {
    return Refuse(absl::StrCat("apply needs a readable --tables_file, got '", path, "'"));
  }
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  tessera::v1::ListTablesResponse wanted;
  const auto parsed = google::protobuf::util::JsonStringToMessage(text, &wanted);
  if (!parsed.ok()) {
    return Refuse(absl::StrCat(path, ": ", parsed.ToString()));
  }
  absl::StatusOr<std::vector<tessera::v1::TableConfig>> existing = tables.ListTables();
  if (!existing.ok()) return Fail("apply", existing.status());
  int failures = 0;
  for (const auto& config : wanted.tables()) {
    const tessera::v1::TableConfig* have = nullptr;
    for (const auto& t : *existing) {
      if (t.name() == config.name()) have = &t;
    }
    if (have != nullptr) {
      if (google::protobuf::util::MessageDifferencer::Equals(*have, config)) {
        std::printf("table '%s': unchanged\n", config.name().c_str());
      } else {
        std::fprintf(stderr, "tessera-cli: table '%s' exists with another config: %s\n",
                     config.name().c_str(), have->ShortDebugString().c_str());
        ++failures;
      }
      continue;
    }
    if (absl::Status s = tables.CreateTable(config); !s.ok()) {
      Fail(absl::StrCat("create '", config.name(), "'"), s);
      ++failures;
      continue;
    }
    std::printf("table '%s': created (dim %d, %s)\n", config.name().c_str(), config.dim(),
                tessera::embedding::DtypeName(config.dtype()).c_str());
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace tessera::cli
