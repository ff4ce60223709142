#ifndef TESSERA_TOOLS_CLI_CLI_H_
#define TESSERA_TOOLS_CLI_CLI_H_

// tessera-cli's commands and what they share: its flags, its client of the coordinator,
// and how failures and checkpoints are printed.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/embedding_client.h"
#include "wire/security.h"

ABSL_DECLARE_FLAG(std::string, coordinator);
ABSL_DECLARE_FLAG(std::string, address);
ABSL_DECLARE_FLAG(std::string, table);
ABSL_DECLARE_FLAG(int, dim);
ABSL_DECLARE_FLAG(std::string, optimizer);
ABSL_DECLARE_FLAG(std::optional<double>, lr);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(int64_t, max_rows);
ABSL_DECLARE_FLAG(std::string, ids);
ABSL_DECLARE_FLAG(int, deadline_ms);
ABSL_DECLARE_FLAG(int64_t, step);
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(bool, all_models);
ABSL_DECLARE_FLAG(std::string, durability);
ABSL_DECLARE_FLAG(std::string, initializer);
ABSL_DECLARE_FLAG(double, init_scale);
ABSL_DECLARE_FLAG(std::string, eviction);
ABSL_DECLARE_FLAG(int64_t, ttl_steps);
ABSL_DECLARE_FLAG(int64_t, vocabulary_size);
ABSL_DECLARE_FLAG(int, admit_min_count);
ABSL_DECLARE_FLAG(double, admit_probability);
ABSL_DECLARE_FLAG(int64_t, admit_sketch_width);
ABSL_DECLARE_FLAG(std::optional<double>, epsilon);
ABSL_DECLARE_FLAG(std::optional<double>, beta1);
ABSL_DECLARE_FLAG(std::optional<double>, beta2);
ABSL_DECLARE_FLAG(std::optional<double>, initial_accumulator);
ABSL_DECLARE_FLAG(std::optional<double>, l1);
ABSL_DECLARE_FLAG(std::optional<double>, l2);
ABSL_DECLARE_FLAG(std::optional<double>, lr_power);
ABSL_DECLARE_FLAG(std::optional<double>, clip_norm);
ABSL_DECLARE_FLAG(std::optional<double>, clip_value);
ABSL_DECLARE_FLAG(std::optional<double>, weight_decay);
ABSL_DECLARE_FLAG(std::string, dtype);
ABSL_DECLARE_FLAG(int64_t, since_step);
ABSL_DECLARE_FLAG(bool, with_state);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(std::string, in);
ABSL_DECLARE_FLAG(std::string, shards);
ABSL_DECLARE_FLAG(std::string, tables_file);

namespace tessera::cli {

// TLS and token from the shared flags (wire/security_flags.h), loaded in main().
tessera::wire::ClientSecurity& Security();

// A client of --coordinator in coordinator mode, with --deadline_ms and no retries (a
// command says what failed at once).
absl::StatusOr<std::unique_ptr<client::EmbeddingClient>> Client();

void PrintCheckpoint(const embedding::CheckpointInfo& c);

// Orders names as people read them: "C2" before "C10" (digit runs compare as numbers).
bool NaturalLess(const std::string& a, const std::string& b);

// The tables of --model (every table without it), in natural order of their names.
std::vector<tessera::v1::TableConfig> TablesOfModel(
    const std::vector<tessera::v1::TableConfig>& tables);

// Prints "tessera-cli: WHAT: CODE: message" (with what a shard or a TLS mismatch looks
// like, for calls to the coordinator); returns 1, the exit code.
int Fail(const std::string& what, const absl::Status& s);
// Prints "tessera-cli: MESSAGE" (a command's flags or files are not what it needs); returns
// 1, the exit code.
int Refuse(absl::string_view message);

// The commands, a file each. Each returns the process's exit code and prints what went
// wrong; each but health talks to the cluster through `tables`, a client of the
// coordinator, and gets --table as `table`.
int Health(const std::string& address);  // of a coordinator or a shard
int Tables(client::EmbeddingClient& tables, const std::string&);
// Creates every table of --tables_file; a table that exists with the same config is left
// as it is, one with another config is an error (nothing is changed).
int Apply(client::EmbeddingClient& tables, const std::string&);
int Create(client::EmbeddingClient& tables, const std::string& table);
// Changes an existing table's optimizer settings to the flags given.
int Alter(client::EmbeddingClient& tables, const std::string& table);
int Drop(client::EmbeddingClient& tables, const std::string& table);
int Lookup(client::EmbeddingClient& tables, const std::string& table);
int Stats(client::EmbeddingClient& tables, const std::string& table);
int PrintShardMap(client::EmbeddingClient& tables, const std::string&);
int TakeCheckpoint(client::EmbeddingClient& tables, const std::string&);
// One model's checkpoint, or with --all_models every model's: a restore rolls tables back,
// so one without a model must say so.
int Restore(client::EmbeddingClient& tables, const std::string&);
int Checkpoints(client::EmbeddingClient& tables, const std::string&);
int Export(client::EmbeddingClient& tables, const std::string& table);
int Import(client::EmbeddingClient& tables, const std::string& table);
// Moves the cluster to the shards of --shards while it trains on.
int Reshard(client::EmbeddingClient& tables, const std::string&);

}  // namespace tessera::cli

#endif  // TESSERA_TOOLS_CLI_CLI_H_
