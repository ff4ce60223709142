#include "embedding/table_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "embedding/internal/admission.h"
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

namespace {

absl::Status ValidateAdmission(const v1::AdmissionConfig& a, const std::string& label) {
  using embedding_internal::AdmissionFilter;
  if (a.min_count() < 0 || a.min_count() > AdmissionFilter::kMaxMinCount) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": admission.min_count must be in [0, ",
                                                   AdmissionFilter::kMaxMinCount, "], got ",
                                                   a.min_count()));
  }
  if (!(a.probability() >= 0.0f && a.probability() <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": admission.probability must be in [0, 1] (0: every id), got ", a.probability()));
  }
  constexpr int64_t kMaxSketchWidth = int64_t{1} << 32;
  if (a.sketch_width() < 0 || a.sketch_width() > kMaxSketchWidth) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": admission.sketch_width must be in [0, ", kMaxSketchWidth,
                     "] (0: ", AdmissionFilter::kDefaultSketchWidth, "), got ", a.sketch_width()));
  }
  return absl::OkStatus();
}

absl::Status ValidateVocabulary(const v1::TableConfig& c, const std::string& label) {
  if (c.vocabulary_size() == 0) return absl::OkStatus();
  if (c.vocabulary_size() < 0 || c.vocabulary_size() > kMaxVocabularySize) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": vocabulary_size must be in [0, ",
                                                   kMaxVocabularySize, "] (0: any id), got ",
                                                   c.vocabulary_size()));
  }
  if (c.max_rows() != 0 || c.eviction().policy() != v1::EVICTION_NONE ||
      c.eviction().ttl_steps() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": a fixed-vocabulary table (vocabulary_size ", c.vocabulary_size(),
        ") holds a row for every id of its vocabulary; it takes no max_rows, eviction or "
        "ttl_steps"));
  }
  return absl::OkStatus();
}

// A table name: what a model's tables are named (MODEL.NAME), safe in paths and commands.
absl::Status ValidateTableName(absl::string_view name) {
  if (name.empty() || name.size() > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("table name must be 1-255 characters, got '", name, "'"));
  }
  const bool dots_apart =
      name.front() != '.' && name.back() != '.' && name.find("..") == absl::string_view::npos;
  const bool characters = std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
  if (!dots_apart || !characters) {
    return absl::InvalidArgumentError(
        absl::StrCat("table name '", name,
                     "': use letters, digits, '_', '-' and '.' (MODEL.NAME), with no "
                     "'.' first, last or twice in a row"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateTableConfig(const v1::TableConfig& config) {
  TESSERA_RETURN_IF_ERROR(ValidateTableName(config.name()));
  const std::string label = absl::StrCat("table '", config.name(), "'");
  if (config.dim() <= 0 || config.dim() > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": dim must be in [1, 65536], got ", config.dim()));
  }
  if (config.max_rows() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": max_rows must be >= 0, got ", config.max_rows()));
  }
  if (!v1::InitializerType_IsValid(config.initializer().type())) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": unknown initializer type ", config.initializer().type()));
  }
  if (config.initializer().has_scale() &&
      !(config.initializer().scale() >= 0.0f && std::isfinite(config.initializer().scale()))) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": initializer scale must be >= 0, got ",
                                                   config.initializer().scale()));
  }
  if (!v1::Dtype_IsValid(config.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": unknown dtype ", config.dtype()));
  }
  if (!v1::Placement_IsValid(config.placement())) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": unknown placement ", config.placement()));
  }
  if (!v1::EvictionPolicy_IsValid(config.eviction().policy())) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": unknown eviction policy ", config.eviction().policy()));
  }
  if (config.eviction().policy() != v1::EVICTION_NONE && config.max_rows() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": eviction needs a row budget (max_rows > 0)"));
  }
  if (config.eviction().ttl_steps() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": ttl_steps must be >= 0, got ", config.eviction().ttl_steps()));
  }
  TESSERA_RETURN_IF_ERROR(ValidateAdmission(config.admission(), label));
  TESSERA_RETURN_IF_ERROR(ValidateVocabulary(config, label));
  absl::StatusOr<OptimizerParams> params = ResolveOptimizer(config.optimizer());
  return Annotate(params.status(), label);
}

absl::Status RequireHostPlacement(const v1::TableConfig& config) {
  if (config.placement() == v1::HOST) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "table '", config.name(),
      "' has placement DEVICE: its rows live in a trainer's GPU memory (tessera-train "
      "--dense_backend=cuda keeps it there); in-process collections and shard servers hold "
      "HOST tables"));
}

void ResizeConfigSlots(size_t n, std::vector<v1::TableConfig>* configs,
                       std::vector<ConfigRef>* held) {
  held->resize(std::min(held->size(), configs->size()));
  configs->resize(n);
  held->resize(n);
}

void SetConfigSlot(size_t i, ConfigRef config, std::vector<v1::TableConfig>* configs,
                   std::vector<ConfigRef>* held) {
  if ((*held)[i] == config) return;
  (*configs)[i] = *config;
  (*held)[i] = std::move(config);
}

}  // namespace tessera::embedding
