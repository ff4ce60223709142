// tessera-cli: a terminal tool for a running Tessera cluster.
//
//   tessera-cli [--coordinator=host:port] health [--address=host:port]
//   tessera-cli tables
//   tessera-cli apply --tables_file=tables.json
//   tessera-cli create --table=user --dim=16 [--optimizer=adagrad --lr=0.05 --seed=1 --dtype=bf16
//                      --eviction=lru --max_rows=N --ttl_steps=N --clip_norm=X
//                      --admit_min_count=K ...: every field]
//   tessera-cli lookup --table=user --ids=1,2,3
//   tessera-cli stats [--table=user]
//   tessera-cli shardmap
//   tessera-cli alter --table=user --lr=0.01 [--clip_norm=1 ...]  (optimizer settings)
//   tessera-cli drop --table=user            (or --model=NAME: every table of the model)
//   tessera-cli checkpoint --step=N [--model=NAME]
//   tessera-cli restore [--step=N] --model=NAME   (or --all_models: every model)
//   tessera-cli export --table=user [--since_step=S] [--with_state] --out=user.npz
//   tessera-cli import --table=user --in=user.npz
//   tessera-cli reshard --shards=host:port,host:port,...   (the new map, in shard order)

#include <iostream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "base/command_line.h"
#include "tools/cli/cli.h"
#include "wire/security_flags.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7000", "host:port of the coordinator");
ABSL_FLAG(std::string, address, "", "health: the server to check (default: the coordinator)");
ABSL_FLAG(std::string, table, "", "table name");
ABSL_FLAG(int, dim, 16, "create: embedding dimension");
ABSL_FLAG(std::string, optimizer, "adagrad", "create: sgd, adagrad, rowwise_adagrad, adam, ftrl");
ABSL_FLAG(std::optional<double>, lr, std::nullopt,
          "create: learning rate (default 0.05); alter: the table's new one");
ABSL_FLAG(uint64_t, seed, 1, "create: table seed");
ABSL_FLAG(int64_t, max_rows, 0, "create: row budget (0 = unlimited)");
ABSL_FLAG(std::string, ids, "", "lookup: comma-separated ids");
ABSL_FLAG(int, deadline_ms, 5000, "deadline of each call (checkpoint and restore: 30 min)");
ABSL_FLAG(int64_t, step, -1, "checkpoint: its step (required); restore: which (-1 = newest)");
ABSL_FLAG(std::string, model, "",
          "checkpoint, restore: the model whose tables (MODEL.*) they cover; empty = every "
          "table of the cluster; drop: drop every table of this model");
ABSL_FLAG(bool, all_models, false,
          "restore: without --model, restore every model of the cluster (rolls back every job "
          "sharing it)");
ABSL_FLAG(std::string, durability, "checkpoint", "create: checkpoint or write_through");
ABSL_FLAG(std::string, initializer, "uniform",
          "create: how new rows start: uniform, normal or zeros");
ABSL_FLAG(double, init_scale, 0.05,
          "create: rows start U(-s, s) (normal: N(0, s^2)), as tessera-train's --init_scale; "
          "0 = 1/sqrt(dim)");
ABSL_FLAG(std::string, eviction, "none",
          "create: what a table full at --max_rows does: none (refuses new rows), lru or lfu");
ABSL_FLAG(int64_t, ttl_steps, 0,
          "create: rows not updated for this many steps are dropped (0 = never)");
ABSL_FLAG(int64_t, vocabulary_size, 0,
          "create: a fixed vocabulary: ids in [0, N), rows addressed by id (0: any id)");
ABSL_FLAG(int, admit_min_count, 0,
          "create: feature admission: an id gets a row once pushes of this many steps carried "
          "it (0 or 1: at once)");
ABSL_FLAG(
    double, admit_probability, 0,
    "create: feature admission: a new id gets a row with this probability (0 or 1: every id)");
ABSL_FLAG(int64_t, admit_sketch_width, 0,
          "create: counters per row of each shard's admission sketch (0: 65536)");
ABSL_FLAG(std::optional<double>, epsilon, std::nullopt,
          "create: optimizer epsilon (default 1e-8 for Adam, 1e-10 for the Adagrads)");
ABSL_FLAG(std::optional<double>, beta1, std::nullopt, "create: Adam beta1 (default 0.9)");
ABSL_FLAG(std::optional<double>, beta2, std::nullopt, "create: Adam beta2 (default 0.999)");
ABSL_FLAG(std::optional<double>, initial_accumulator, std::nullopt,
          "create: Adagrad's and FTRL's initial accumulator (default 0)");
ABSL_FLAG(std::optional<double>, l1, std::nullopt, "create: FTRL l1 (default 0)");
ABSL_FLAG(std::optional<double>, l2, std::nullopt, "create: FTRL l2 (default 0)");
ABSL_FLAG(std::optional<double>, lr_power, std::nullopt,
          "create: FTRL learning rate power (default -0.5)");
ABSL_FLAG(std::optional<double>, clip_norm, std::nullopt,
          "create: clip each row's summed gradient to this L2 norm (default 0: off)");
ABSL_FLAG(std::optional<double>, clip_value, std::nullopt,
          "create: clip each gradient element to +-this (default 0: off)");
ABSL_FLAG(std::optional<double>, weight_decay, std::nullopt,
          "create: adds weight_decay * w to the gradient (default 0)");
ABSL_FLAG(std::string, dtype, "fp32", "create: stored weights: fp32, fp16 or bf16");
ABSL_FLAG(int64_t, since_step, -1,
          "export: only rows updated at or after this step (-1 = every stored row)");
ABSL_FLAG(bool, with_state, false, "export: include optimizer state (to train on after import)");
ABSL_FLAG(std::string, out, "", "export: the .npz file to write");
ABSL_FLAG(std::string, in, "", "import: the .npz file to read (tessera-cli export's, or np.savez's "
          "with ids and weights)");
ABSL_FLAG(std::string, shards, "",
          "reshard: the shards of the new map, host:port in shard order (new ones started "
          "empty with their --shard_index, --num_shards and the next --shard_map_version)");
ABSL_FLAG(std::string, tables_file, "",
          "apply: JSON file {\"tables\": [TableConfig, ...]} (proto3 JSON field names)");

namespace tessera::cli {
namespace {

// Every command, in the order usage lists them; each but health gets a client of the
// coordinator and --table.
struct Command {
  const char* name;
  int (*run)(client::EmbeddingClient& tables, const std::string& table);
};
constexpr Command kCommands[] = {
    {"health", nullptr},  // of --address (default: the coordinator), with no client
    {"tables", Tables},
    {"apply", Apply},
    {"create", Create},
    {"alter", Alter},
    {"drop", Drop},
    {"lookup", Lookup},
    {"stats", Stats},
    {"shardmap", PrintShardMap},
    {"checkpoint", TakeCheckpoint},
    {"restore", Restore},
    {"checkpoints", Checkpoints},
    {"export", Export},
    {"import", Import},
    {"reshard", Reshard},
};

// "health|tables|...|import", or with `last` before the last: "health, ..., export or import".
std::string CommandNames(absl::string_view separator, absl::string_view last) {
  std::string out;
  const size_t n = std::size(kCommands);
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) absl::StrAppend(&out, i + 1 == n ? last : separator);
    absl::StrAppend(&out, kCommands[i].name);
  }
  return out;
}

int Run(const std::string& command) {
  if (command == "health") {
    const std::string address = absl::GetFlag(FLAGS_address);
    return Health(address.empty() ? absl::GetFlag(FLAGS_coordinator) : address);
  }
  for (const Command& c : kCommands) {
    if (command != c.name || c.run == nullptr) continue;
    absl::StatusOr<std::unique_ptr<client::EmbeddingClient>> tables = Client();
    if (!tables.ok()) return Fail(command, tables.status());
    return c.run(**tables, absl::GetFlag(FLAGS_table));
  }
  std::cerr << "tessera-cli: unknown command '" << command << "'; expected "
            << CommandNames(", ", " or ") << "\n";
  return 1;
}

}  // namespace
}  // namespace tessera::cli

int main(int argc, char** argv) {
  const std::string usage = "tessera-cli [flags] " + tessera::cli::CommandNames("|", "|");
  std::vector<char*> rest = tessera::base::ParseCommandLine(argc, argv, "tessera-cli", usage);
  if (rest.size() != 2) {
    std::cerr << "usage: " << usage << "\n";
    return 1;
  }
  absl::StatusOr<tessera::wire::ClientSecurity> security = tessera::wire::ClientSecurityFromFlags();
  if (!security.ok()) {
    std::cerr << "tessera-cli: " << security.status().message() << "\n";
    return 1;
  }
  tessera::cli::Security() = *security;
  return tessera::cli::Run(rest[1]);
}
