// tessera-cli: the table settings of its flags.
#include "tools/cli/table_flags.h"

#include <algorithm>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "embedding/dtype.h"
#include "embedding/optimizer.h"
#include "tools/cli/cli.h"

namespace tessera::cli {

namespace {

// The optimizer settings: each flag and the OptimizerConfig field it sets.
constexpr std::pair<const char*, const char*> kOptimizerSettings[] = {
    {"--lr", "learning_rate"},
    {"--epsilon", "epsilon"},
    {"--beta1", "beta1"},
    {"--beta2", "beta2"},
    {"--initial_accumulator", "initial_accumulator"},
    {"--l1", "l1"},
    {"--l2", "l2"},
    {"--lr_power", "learning_rate_power"},
    {"--clip_norm", "clip_norm"},
    {"--clip_value", "clip_value"},
    {"--weight_decay", "weight_decay"},
};

// `value` of enum flag `flag` in any case, '-' for '_', with or without the proto's
// `prefix` ("lru", "EVICTION_LRU"); InvalidArgument naming the choices.
absl::StatusOr<int> ParseEnumFlag(const std::string& flag, const std::string& value,
                                  const google::protobuf::EnumDescriptor* type,
                                  const std::string& prefix = "") {
  std::string name = absl::AsciiStrToUpper(value);
  std::replace(name.begin(), name.end(), '-', '_');
  for (const std::string& candidate : {name, prefix + name}) {
    if (const auto* v = type->FindValueByName(candidate); v != nullptr) return v->number();
  }
  std::vector<std::string> choices;
  for (int i = 0; i < type->value_count(); ++i) {
    std::string choice = type->value(i)->name();
    if (absl::StartsWith(choice, prefix)) choice = choice.substr(prefix.size());
    if (!absl::StrContains(choice, "UNSPECIFIED")) choices.push_back(absl::AsciiStrToLower(choice));
  }
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": unknown value '", value,
                                                 "'; expected ", absl::StrJoin(choices, ", ")));
}

// True when an optimizer of `type` uses setting `field`. Every type uses the learning rate,
// clipping and weight decay; a type not listed here is not judged.
bool UsesSetting(tessera::v1::OptimizerType type, const std::string& field) {
  static const auto* own = new std::map<tessera::v1::OptimizerType, std::set<std::string>>{
      {tessera::v1::SGD, {}},
      {tessera::v1::ADAGRAD, {"epsilon", "initial_accumulator"}},
      {tessera::v1::ROWWISE_ADAGRAD, {"epsilon", "initial_accumulator"}},
      {tessera::v1::ADAM, {"epsilon", "beta1", "beta2"}},
      {tessera::v1::FTRL, {"initial_accumulator", "l1", "l2", "learning_rate_power"}},
  };
  if (field == "learning_rate" || field == "clip_norm" || field == "clip_value" ||
      field == "weight_decay") {
    return true;
  }
  const auto it = own->find(type);
  return it == own->end() || it->second.count(field) > 0;
}

}  // namespace

std::vector<const char*> OptimizerSettingFlags() {
  std::vector<const char*> flags;
  for (const auto& setting : kOptimizerSettings) flags.push_back(setting.first);
  return flags;
}

// The optimizer settings given as flags (--lr, --epsilon, ...), and only those: what
// `alter` changes, and what `create` sets beyond the defaults.
tessera::v1::OptimizerConfig OptimizerChanges() {
  using Config = tessera::v1::OptimizerConfig;
  const std::pair<std::optional<double>, void (Config::*)(float)> settings[] = {
      {absl::GetFlag(FLAGS_lr), &Config::set_learning_rate},
      {absl::GetFlag(FLAGS_epsilon), &Config::set_epsilon},
      {absl::GetFlag(FLAGS_beta1), &Config::set_beta1},
      {absl::GetFlag(FLAGS_beta2), &Config::set_beta2},
      {absl::GetFlag(FLAGS_initial_accumulator), &Config::set_initial_accumulator},
      {absl::GetFlag(FLAGS_l1), &Config::set_l1},
      {absl::GetFlag(FLAGS_l2), &Config::set_l2},
      {absl::GetFlag(FLAGS_lr_power), &Config::set_learning_rate_power},
      {absl::GetFlag(FLAGS_clip_norm), &Config::set_clip_norm},
      {absl::GetFlag(FLAGS_clip_value), &Config::set_clip_value},
      {absl::GetFlag(FLAGS_weight_decay), &Config::set_weight_decay},
  };
  Config out;
  for (const auto& [value, set] : settings) {
    if (value.has_value()) (out.*set)(static_cast<float>(*value));
  }
  return out;
}

// Refuses (false, saying why and what `type` takes) settings of `config` that `type` would
// ignore (beta1 for SGD).
bool SettingsTakeEffect(const char* command, const tessera::v1::OptimizerConfig& config,
                        tessera::v1::OptimizerType type) {
  std::vector<std::string> unused, used;
  for (const auto& [flag, field] : kOptimizerSettings) {
    if (UsesSetting(type, field)) {
      used.push_back(flag);
    } else if (config.GetReflection()->HasField(config,
                                                config.GetDescriptor()->FindFieldByName(field))) {
      unused.push_back(flag);
    }
  }
  if (unused.empty()) return true;
  std::cerr << "tessera-cli: " << command << ": " << absl::StrJoin(unused, ", ")
            << (unused.size() == 1 ? " does" : " do") << " nothing with optimizer "
            << tessera::embedding::OptimizerName(type) << ", which takes "
            << absl::StrJoin(used, ", ") << "; leave " << (unused.size() == 1 ? "it" : "them")
            << " out\n";
  return false;
}

// The TableConfig of `create`'s flags: every field, with tessera-train's defaults; the
// optimizer settings left out keep the servers' defaults.
absl::StatusOr<tessera::v1::TableConfig> CreateConfig(const std::string& table) {
  tessera::v1::TableConfig c;
  c.set_name(table);
  c.set_dim(absl::GetFlag(FLAGS_dim));
  c.set_seed(absl::GetFlag(FLAGS_seed));
  c.set_max_rows(absl::GetFlag(FLAGS_max_rows));
  TESSERA_ASSIGN_OR_RETURN(tessera::v1::Dtype dtype,
                           tessera::embedding::ParseDtypeName(absl::GetFlag(FLAGS_dtype)));
  c.set_dtype(dtype);
  TESSERA_ASSIGN_OR_RETURN(tessera::v1::OptimizerType type,
                           tessera::embedding::ParseOptimizerName(absl::GetFlag(FLAGS_optimizer)));
  auto* o = c.mutable_optimizer();
  *o = OptimizerChanges();
  o->set_type(type);
  if (!o->has_learning_rate()) o->set_learning_rate(0.05f);  // tessera-train's default
  TESSERA_ASSIGN_OR_RETURN(int initializer,
                           ParseEnumFlag("initializer", absl::GetFlag(FLAGS_initializer),
                                         tessera::v1::InitializerType_descriptor()));
  // UNIFORM is what an unspecified initializer means, and is sent as that.
  if (initializer != tessera::v1::UNIFORM) {
    c.mutable_initializer()->set_type(static_cast<tessera::v1::InitializerType>(initializer));
  }
  if (const double scale = absl::GetFlag(FLAGS_init_scale); scale > 0) {
    c.mutable_initializer()->set_scale(static_cast<float>(scale));
  }
  TESSERA_ASSIGN_OR_RETURN(int durability,
                           ParseEnumFlag("durability", absl::GetFlag(FLAGS_durability),
                                         tessera::v1::Durability_descriptor()));
  c.set_durability(static_cast<tessera::v1::Durability>(durability));
  TESSERA_ASSIGN_OR_RETURN(int eviction,
                           ParseEnumFlag("eviction", absl::GetFlag(FLAGS_eviction),
                                         tessera::v1::EvictionPolicy_descriptor(), "EVICTION_"));
  c.mutable_eviction()->set_policy(static_cast<tessera::v1::EvictionPolicy>(eviction));
  c.mutable_eviction()->set_ttl_steps(absl::GetFlag(FLAGS_ttl_steps));
  c.set_vocabulary_size(absl::GetFlag(FLAGS_vocabulary_size));
  if (absl::GetFlag(FLAGS_admit_min_count) != 0 || absl::GetFlag(FLAGS_admit_probability) != 0 ||
      absl::GetFlag(FLAGS_admit_sketch_width) != 0) {
    tessera::v1::AdmissionConfig* a = c.mutable_admission();
    a->set_min_count(absl::GetFlag(FLAGS_admit_min_count));
    a->set_probability(static_cast<float>(absl::GetFlag(FLAGS_admit_probability)));
    a->set_sketch_width(absl::GetFlag(FLAGS_admit_sketch_width));
  }
  return c;
}

}  // namespace tessera::cli
