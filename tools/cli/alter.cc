// tessera-cli alter.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/reflection.h"
#include "absl/strings/str_join.h"
#include "tools/cli/cli.h"
#include "tools/cli/table_flags.h"

namespace tessera::cli {

// Changes an existing table's optimizer settings to the flags given; prints the table's
// settings before and after.
int Alter(client::EmbeddingClient& tables, const std::string& table) {
  const tessera::v1::OptimizerConfig changes = OptimizerChanges();
  const absl::CommandLineFlag* type = absl::FindCommandLineFlag("optimizer");
  if (changes.ByteSizeLong() == 0 && type != nullptr &&
      type->CurrentValue() != type->DefaultValue()) {
    // The rows' optimizer state is the type's: it cannot change under them.
    return Refuse(
        "alter cannot change a table's optimizer type (--optimizer is "
        "create's: a table keeps the type it was made with, as its rows' optimizer "
        "state is that type's); give the settings to change (--lr, --epsilon, ...), or "
        "make a new table of that type and import the weights (export, create, "
        "import)");
  }
  if (table.empty() || changes.ByteSizeLong() == 0) {
    return Refuse(absl::StrCat("alter needs --table=NAME and at least one optimizer setting (",
                               absl::StrJoin(OptimizerSettingFlags(), ", "), ")"));
  }
  // Settings the table's optimizer would ignore are refused (a table not listed is left to
  // the coordinator to name).
  if (absl::StatusOr<std::vector<tessera::v1::TableConfig>> listed = tables.ListTables();
      listed.ok()) {
    for (const tessera::v1::TableConfig& t : *listed) {
      if (t.name() == table && !SettingsTakeEffect("alter", changes, t.optimizer().type())) {
        return 1;
      }
    }
  }
  absl::StatusOr<tessera::v1::TableConfig> altered = tables.AlterTable(table, changes);
  if (!altered.ok()) return Fail("alter", altered.status());
  std::printf("altered table '%s': optimizer %s\n", table.c_str(),
              altered->optimizer().ShortDebugString().c_str());
  return 0;
}

}  // namespace tessera::cli
