#include "embedding/table_config.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "embedding/optimizer.h"
#include "google/protobuf/text_format.h"

namespace tessera::embedding {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

std::string FieldValue(const Message& m, const FieldDescriptor* f) {
  const auto* reflection = m.GetReflection();
  if (f->has_presence() && !reflection->HasField(m, f)) return "unset";
  std::string out;
  google::protobuf::TextFormat::PrintFieldValueToString(m, f, -1, &out);
  return out;
}

void Differences(const Message& have, const Message& want, const std::string& prefix,
                 absl::Span<const std::string> ignored, std::vector<std::string>* out) {
  const auto* descriptor = have.GetDescriptor();
  const auto* reflection = have.GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* f = descriptor->field(i);
    const std::string path = prefix + f->name();
    if (std::find(ignored.begin(), ignored.end(), path) != ignored.end() || f->is_repeated()) {
      continue;
    }
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      Differences(reflection->GetMessage(have, f), reflection->GetMessage(want, f), path + ".",
                  ignored, out);
      continue;
    }
    const std::string a = FieldValue(have, f), b = FieldValue(want, f);
    if (a != b) out->push_back(absl::StrCat(path, " ", a, " (the table's) vs ", b));
  }
}

}  // namespace

std::vector<std::string> TableConfigDifferences(const v1::TableConfig& have,
                                                const v1::TableConfig& want,
                                                absl::Span<const std::string> ignored) {
  std::vector<std::string> out;
  Differences(have, want, "", ignored, &out);
  return out;
}

absl::StatusOr<v1::TableConfig> AlterOptimizer(const v1::TableConfig& config,
                                               const v1::OptimizerConfig& changes) {
  const v1::OptimizerType type = config.optimizer().type();
  if (changes.type() != v1::OPTIMIZER_UNSPECIFIED && changes.type() != type) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", config.name(), "': its optimizer is ", v1::OptimizerType_Name(type),
        " and cannot become ", v1::OptimizerType_Name(changes.type()),
        " (the rows' state would not fit); create a new table and import the rows' weights"));
  }
  v1::TableConfig out = config;
  v1::OptimizerConfig merged = changes;
  merged.clear_type();
  out.mutable_optimizer()->MergeFrom(merged);
  TESSERA_RETURN_IF_ERROR(Annotate(ResolveOptimizer(out.optimizer()).status(),
                                   absl::StrCat("table '", config.name(), "'")));
  return out;
}

}  // namespace tessera::embedding
