// tessera-cli create.
#include <cstdio>
#include <string>

#include "tools/cli/cli.h"
#include "tools/cli/table_flags.h"

namespace tessera::cli {

int Create(client::EmbeddingClient& tables, const std::string& table) {
  if (table.empty()) return Refuse("create needs --table=NAME (and --dim)");
  absl::StatusOr<tessera::v1::TableConfig> config = CreateConfig(table);
  if (!config.ok()) {
    return Refuse(config.status().message());
  }
  if (!SettingsTakeEffect("create", config->optimizer(), config->optimizer().type())) return 1;
  if (absl::Status s = tables.CreateTable(*config); !s.ok()) return Fail("create", s);
  std::printf("created table '%s' (dim %d)\n", table.c_str(), config->dim());
  return 0;
}

}  // namespace tessera::cli
