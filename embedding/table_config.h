#ifndef TESSERA_EMBEDDING_TABLE_CONFIG_H_
#define TESSERA_EMBEDDING_TABLE_CONFIG_H_

#include <string>
#include <vector>

#include "absl/types/span.h"
#include "tessera/v1/config.pb.h"

namespace tessera::embedding {

// The fields in which `have` (a table as it exists) and `want` (what a caller asks for)
// differ, one entry each, as "optimizer.learning_rate 0.05 (the table's) vs 0.5": so that a
// refusal names the field and both values. Fields named in `ignored` (dotted paths such as
// "seed" or "optimizer.learning_rate") are not compared. An optional field that is unset
// reads "unset". Empty when they agree.
std::vector<std::string> TableConfigDifferences(const v1::TableConfig& have,
                                                const v1::TableConfig& want,
                                                absl::Span<const std::string> ignored = {});

}  // namespace tessera::embedding

#endif  // TESSERA_EMBEDDING_TABLE_CONFIG_H_
