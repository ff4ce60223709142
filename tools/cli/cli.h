#ifndef TESSERA_TOOLS_CLI_CLI_H_
#define TESSERA_TOOLS_CLI_CLI_H_

// tessera-cli's commands and what they share: its flags, the coordinator's channel and
// call context, and how failures and checkpoints are printed.

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
#include "grpcpp/grpcpp.h"
#include "tessera/v1/embedding_service.grpc.pb.h"
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

using v1::Coordinator;

// TLS and token from the shared flags (wire/security_flags.h), loaded in main().
tessera::wire::ClientSecurity& Security();

std::shared_ptr<grpc::Channel> Channel(const std::string& address);

// A client of --coordinator in coordinator mode, with --deadline_ms and no retries (a
// command says what failed at once).
absl::StatusOr<std::unique_ptr<client::EmbeddingClient>> Client();

std::unique_ptr<grpc::ClientContext> Context(int deadline_ms = absl::GetFlag(FLAGS_deadline_ms));

void PrintCheckpoint(const embedding::CheckpointInfo& c);

// Orders names as people read them: "C2" before "C10" (digit runs compare as numbers).
bool NaturalLess(const std::string& a, const std::string& b);

// The tables of --model (every table without it), in natural order of their names.
std::vector<tessera::v1::TableConfig> TablesOfModel(
    const std::vector<tessera::v1::TableConfig>& tables);

// Prints "tessera-cli: WHAT: CODE: message" (with what a shard or a TLS mismatch looks
// like, for calls to the coordinator); returns 1, the exit code.
int Fail(const std::string& what, const absl::Status& s);
int Fail(const std::string& what, const grpc::Status& s);

// Calls that take long: checkpoints, restores, reshards.
extern const int kCheckpointDeadlineMs;

// The commands. Each returns the process's exit code and prints what went wrong. The table
// commands go through the client library; the others call the coordinator's service.
// Changes an existing table's optimizer settings to the flags given; prints the table's
// settings before and after.
int Alter(client::EmbeddingClient& tables, const std::string& table);
int Create(client::EmbeddingClient& tables, const std::string& table);
int Tables(client::EmbeddingClient& tables, const std::string&);
// Creates every table of --tables_file; a table that exists with the same config is left
// as it is, one with another config is an error (nothing is changed).
int Apply(client::EmbeddingClient& tables, const std::string&);
int Drop(client::EmbeddingClient& tables, const std::string& table);
int Export(tessera::v1::Coordinator::Stub& stub, const std::string& table);
int Import(tessera::v1::Coordinator::Stub& stub, const std::string& table);
int Lookup(Coordinator::Stub& stub, const std::string& table);
int Health();
int Stats(Coordinator::Stub& stub, const std::string& table);
int PrintShardMap(Coordinator::Stub& stub, const std::string&);
int TakeCheckpoint(client::EmbeddingClient& tables, const std::string&);
int Checkpoints(client::EmbeddingClient& tables, const std::string&);
// One model's checkpoint, or with --all_models every model's: a restore rolls tables back,
// so one without a model must say so.
int Restore(Coordinator::Stub& stub);
// Moves the cluster to the shards of --shards while it trains on.
int Reshard(Coordinator::Stub& stub);

}  // namespace tessera::cli

#endif  // TESSERA_TOOLS_CLI_CLI_H_
