// The defaults of EmbeddingCollection (collections without storage, per-table batches)
// and the model and id helpers of collection.h.

#include "embedding/collection.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "embedding/batch_ops.h"

namespace tessera::embedding {
namespace {

absl::Status NoStorage() {
  return absl::FailedPreconditionError(
      "this collection has no storage: checkpoints need a data directory (--data_dir)");
}

}  // namespace

uint64_t RandomNonZeroId() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32 | rd()) | 1;
}

absl::Status EmbeddingCollection::LookupBatch(absl::Span<const TableBags> tables,
                                              const LookupOptions& options) {
  for (const TableBags& t : tables) {
    TESSERA_RETURN_IF_ERROR(
        CheckLookupShape(absl::StrCat("table '", t.table, "'"), t.ids.size(), t.offsets, t.weights)
            .status());
    TESSERA_RETURN_IF_ERROR(t.offsets.empty() ? Lookup(t.table, t.ids, t.out, options)
                                              : PooledLookup(t.table, t.ids, t.offsets, t.weights,
                                                             t.pooling, t.out, options));
  }
  return absl::OkStatus();
}

absl::Status RefuseSync(const PushOptions& options) {
  if (!options.sync.active()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "synchronous pushes of data-parallel workers need tables on a cluster (shards and a "
      "coordinator); these are in this process");
}

absl::Status EmbeddingCollection::PushThenLookup(absl::Span<const TableGradients> push,
                                                 int64_t step, const PushOptions& push_options,
                                                 absl::Span<const TableBags> lookups,
                                                 const LookupOptions& options) {
  TESSERA_RETURN_IF_ERROR(PushBatch(push, step, push_options));
  return LookupBatch(lookups, options);
}

absl::Status EmbeddingCollection::PushBatch(absl::Span<const TableGradients> tables, int64_t step,
                                            const PushOptions& options) {
  TESSERA_RETURN_IF_ERROR(RefuseSync(options));
  if (tables.empty()) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(std::vector<v1::TableConfig> configs, ListTables());
  for (const TableGradients& t : tables) {
    auto it = std::find_if(configs.begin(), configs.end(),
                           [&](const v1::TableConfig& c) { return c.name() == t.table; });
    if (it == configs.end()) {
      return absl::NotFoundError(absl::StrCat("table '", t.table, "' not found"));
    }
    TESSERA_RETURN_IF_ERROR(CheckPush({&*it, 1}, {&t, 1}).status());
  }
  if (options.check_only) return absl::OkStatus();
  absl::Status partly;
  for (const TableGradients& t : tables) {
    TESSERA_RETURN_IF_ERROR(
        SetAsidePartlyApplied(PushGradients(t.table, t.ids, t.gradients, step), &partly));
  }
  return partly;
}

absl::StatusOr<Checkpointing*> CheckpointsOf(EmbeddingCollection& tables) {
  Checkpointing* checkpoints = tables.checkpointing();
  if (checkpoints == nullptr) return NoStorage();
  return checkpoints;
}

absl::Status EmbeddingCollection::ExportRows(absl::string_view table, const ExportOptions&,
                                             const std::function<absl::Status(const RowBlock&)>&) {
  return absl::UnimplementedError(
      absl::StrCat("table '", table, "': this collection cannot export rows"));
}

absl::Status EmbeddingCollection::ImportRows(absl::string_view table, const RowBlock&) {
  return absl::UnimplementedError(
      absl::StrCat("table '", table, "': this collection cannot import rows"));
}

absl::StatusOr<v1::TableConfig> EmbeddingCollection::AlterTable(absl::string_view table,
                                                                const v1::OptimizerConfig&) {
  return absl::UnimplementedError(
      absl::StrCat("table '", table, "': this collection cannot alter tables"));
}

absl::Status ValidateModelName(absl::string_view model) {
  if (model.empty() || model.size() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("model name must be 1-64 characters, got '", model, "'"));
  }
  for (const char c : model) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model name '", model, "': use letters, digits, '_' and '-' (its tables are '", model,
          ".<name>')"));
    }
  }
  return absl::OkStatus();
}

bool TableOfModel(absl::string_view table, absl::string_view model) {
  return model.empty() || (table.size() > model.size() + 1 &&
                           table.substr(0, model.size()) == model && table[model.size()] == '.');
}

std::string RestoreCommand(absl::string_view model, int64_t step) {
  return absl::StrCat("tessera-cli restore ",
                      model.empty() ? std::string("--all_models") : absl::StrCat("--model=", model),
                      " --step=", step);
}

std::string CheckpointName(absl::string_view model, int64_t step) {
  return model.empty() ? absl::StrCat("checkpoint ", step)
                       : absl::StrCat("checkpoint ", step, " of model '", model, "'");
}

namespace {

// `key=value` words of `signature` by key; false when a word is not of that form.
bool SignatureWords(absl::string_view signature, std::map<std::string, std::string>* words) {
  for (absl::string_view word : absl::StrSplit(signature, ' ', absl::SkipEmpty())) {
    const size_t eq = word.find('=');
    if (eq == absl::string_view::npos || eq == 0) return false;
    (*words)[std::string(word.substr(0, eq))] = std::string(word.substr(eq + 1));
  }
  return !words->empty();
}

// OK when attachment `name` of checkpoint `which`, `has`, matches `want` (see
// CheckRestorable); else FailedPrecondition naming what differs.
absl::Status CheckAttachment(const std::string& which, const std::string& name,
                             const std::string& has, const std::string& want) {
  if (has == want) return absl::OkStatus();
  std::map<std::string, std::string> had, wanted;
  if (!SignatureWords(has, &had) || !SignatureWords(want, &wanted)) {
    return absl::FailedPreconditionError(absl::StrCat(which, " has '", name, "' = '", has,
                                                      "', this run wants '", want,
                                                      "'; nothing was restored"));
  }
  std::vector<std::string> differences;
  for (const auto& [key, value] : had) {
    auto it = wanted.find(key);
    const std::string ours = it == wanted.end() ? "(not set)" : it->second;
    if (ours != value) {
      differences.push_back(absl::StrCat(key, ": the checkpoint's ", value, ", this run's ", ours));
    }
  }
  if (differences.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      which, " is of another run (", absl::StrJoin(differences, "; "),
      "); nothing was restored: run with the checkpoint's values, or with another --model "
      "or --data_dir to start afresh"));
}

}  // namespace

absl::Status CheckRestorable(int64_t step, const Attachments& attachments,
                             const RestoreOptions& options) {
  const std::string which = CheckpointName(options.model, step);
  for (const std::string& name : options.required_attachments) {
    if (attachments.count(name) == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(which, " holds no '", name, "' attachment; nothing was restored"));
    }
  }
  for (const auto& [name, want] : options.expected_attachments) {
    auto it = attachments.find(name);
    if (it == attachments.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat(which, " holds no '", name, "' attachment; nothing was restored"));
    }
    TESSERA_RETURN_IF_ERROR(CheckAttachment(which, name, it->second, want));
  }
  return absl::OkStatus();
}

}  // namespace tessera::embedding
