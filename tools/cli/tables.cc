// tessera-cli tables.
#include <cstdio>
#include <string>
#include <vector>

#include "embedding/dtype.h"
#include "embedding/optimizer.h"
#include "tools/cli/cli.h"

namespace tessera::cli {

int Tables(client::EmbeddingClient& tables, const std::string&) {
  absl::StatusOr<std::vector<tessera::v1::TableConfig>> listed = tables.ListTables();
  if (!listed.ok()) return Fail("tables", listed.status());
  std::printf("%-20s %6s %-5s %-16s %10s %12s\n", "table", "dim", "dtype", "optimizer", "lr",
              "max_rows");
  for (const auto& t : TablesOfModel(*listed)) {
    std::printf("%-20s %6d %-5s %-16s %10g %12lld\n", t.name().c_str(), t.dim(),
                tessera::embedding::DtypeName(t.dtype()).c_str(),
                tessera::embedding::OptimizerName(t.optimizer().type()).c_str(),
                t.optimizer().learning_rate(), static_cast<long long>(t.max_rows()));
  }
  return 0;
}

}  // namespace tessera::cli
