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

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "base/command_line.h"
#include "base/status.h"
#include "client/channel_policy.h"
#include "client/shard_router.h"
#include "embedding/collection.h"
#include "embedding/dtype.h"
#include "embedding/optimizer.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tessera/v1/embedding_service.grpc.pb.h"
#include "tools/npz.h"
#include "wire/grpc_status.h"
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

namespace {

using tessera::v1::Coordinator;

// TLS and token from the shared flags (wire/security_flags.h), loaded in main().
tessera::wire::ClientSecurity& Security() {
  static tessera::wire::ClientSecurity security;
  return security;
}

std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  grpc::ChannelArguments args = tessera::client::ChannelArgs();
  auto credentials = tessera::wire::MakeChannelCredentials(Security(), &args);
  return grpc::CreateCustomChannel(address, credentials, args);
}

std::unique_ptr<grpc::ClientContext> Context(int deadline_ms = absl::GetFlag(FLAGS_deadline_ms)) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  tessera::wire::Authorize(Security(), ctx.get());
  return ctx;
}

constexpr int kCheckpointDeadlineMs =
    static_cast<int>(tessera::client::kCheckpointDeadline.count());

void PrintCheckpoint(const tessera::v1::CheckpointInfo& c) {
  if (!c.model().empty()) std::printf("model %s ", c.model().c_str());
  const std::string created = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ",
                                               absl::FromUnixMillis(c.created_unix_ms()),
                                               absl::UTCTimeZone());
  std::printf("step %lld: %lld rows, %lld bytes, %zu shard(s), created %s",
              static_cast<long long>(c.step()), static_cast<long long>(c.rows()),
              static_cast<long long>(c.bytes()), static_cast<size_t>(c.shards_size()),
              created.c_str());
  if (c.seconds() > 0) std::printf(", took %.2f s", c.seconds());
  std::printf("\n");
}

// Orders names as people read them: "C2" before "C10" (digit runs compare as numbers).
bool NaturalLess(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (absl::ascii_isdigit(a[i]) && absl::ascii_isdigit(b[j])) {
      size_t i_end = i, j_end = j;
      while (i_end < a.size() && absl::ascii_isdigit(a[i_end])) ++i_end;
      while (j_end < b.size() && absl::ascii_isdigit(b[j_end])) ++j_end;
      // Without leading zeros, a longer run is a larger number.
      absl::string_view x = absl::string_view(a).substr(i, i_end - i);
      absl::string_view y = absl::string_view(b).substr(j, j_end - j);
      while (x.size() > 1 && x[0] == '0') x.remove_prefix(1);
      while (y.size() > 1 && y[0] == '0') y.remove_prefix(1);
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      i = i_end;
      j = j_end;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

// The tables of --model (every table without it), in natural order of their names.
std::vector<tessera::v1::TableConfig> TablesOfModel(const tessera::v1::ListTablesResponse& resp) {
  const std::string model = absl::GetFlag(FLAGS_model);
  std::vector<tessera::v1::TableConfig> out;
  for (const auto& t : resp.tables()) {
    if (tessera::embedding::TableOfModel(t.name(), model)) out.push_back(t);
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return NaturalLess(a.name(), b.name()); });
  return out;
}

int Fail(const std::string& what, const grpc::Status& s) {
  // Calls go to the coordinator but for `health --address`: say what a shard or a TLS
  // mismatch looks like.
  absl::Status explained = tessera::wire::ExplainCoordinatorFailure(
      tessera::wire::FromGrpcStatus(s), absl::GetFlag(FLAGS_coordinator), Security());
  std::cerr << "tessera-cli: " << what << ": " << absl::StatusCodeToString(explained.code())
            << ": " << explained.message() << "\n";
  return 1;
}

// Array `name` of the .npz arrays.
tessera::tools::NpyArray Array(const std::string& dtype, std::vector<int64_t> shape,
                               const std::string& bytes) {
  tessera::tools::NpyArray a;
  a.dtype = dtype;
  a.shape = std::move(shape);
  a.data = bytes;
  return a;
}

int Export(tessera::v1::Coordinator::Stub& stub, const std::string& table) {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (table.empty() || out.empty()) {
    std::cerr << "tessera-cli: export needs --table=NAME and --out=FILE.npz\n";
    return 1;
  }
  tessera::v1::ExportRowsRequest req;
  req.set_table(table);
  req.set_since_step(absl::GetFlag(FLAGS_since_step));
  req.set_with_state(absl::GetFlag(FLAGS_with_state));
  auto ctx = Context(kCheckpointDeadlineMs);
  auto reader = stub.ExportRows(ctx.get(), req);
  std::string ids, weights, state, last_steps, update_counts;
  int dim = 0, state_floats = 0;
  tessera::v1::RowChunk chunk;
  while (reader->Read(&chunk)) {
    dim = chunk.dim();
    state_floats = chunk.state_floats();
    ids += chunk.ids();
    weights += chunk.weights();
    state += chunk.state();
    last_steps += chunk.last_steps();
    update_counts += chunk.update_counts();
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) return Fail("export", s);
  if (dim == 0) {  // no rows: the table's dim from its config
    auto lctx = Context();
    tessera::v1::ListTablesResponse tables;
    if (stub.ListTables(lctx.get(), {}, &tables).ok()) {
      for (const auto& t : tables.tables()) {
        if (t.name() == table) dim = t.dim();
      }
    }
  }
  const int64_t n = static_cast<int64_t>(ids.size() / sizeof(int64_t));
  std::map<std::string, tessera::tools::NpyArray> arrays = {
      {"ids", Array("<i8", {n}, ids)},
      {"weights", Array("<f4", {n, dim}, weights)},
      {"last_step", Array("<i8", {n}, last_steps)},
      {"update_count", Array("<i8", {n}, update_counts)}};
  if (absl::GetFlag(FLAGS_with_state)) {
    arrays["state"] = Array("<f4", {n, state_floats}, state);
  }
  absl::Status written = tessera::tools::WriteNpz(out, arrays);
  if (!written.ok()) {
    std::cerr << "tessera-cli: export: " << written.message() << "\n";
    return 1;
  }
  std::printf("exported %lld rows of table '%s' (dim %d%s) to %s\n", static_cast<long long>(n),
              table.c_str(), dim, absl::GetFlag(FLAGS_with_state) ? ", with optimizer state" : "",
              out.c_str());
  return 0;
}

int Import(tessera::v1::Coordinator::Stub& stub, const std::string& table) {
  const std::string in = absl::GetFlag(FLAGS_in);
  if (table.empty() || in.empty()) {
    std::cerr << "tessera-cli: import needs --table=NAME and --in=FILE.npz\n";
    return 1;
  }
  auto arrays = tessera::tools::ReadNpz(in);
  if (!arrays.ok()) {
    std::cerr << "tessera-cli: import: " << arrays.status().message() << "\n";
    return 1;
  }
  auto need = [&](const std::string& name, const std::string& dtype,
                  size_t rank) -> const tessera::tools::NpyArray* {
    auto it = arrays->find(name);
    if (it == arrays->end()) return nullptr;
    if (it->second.dtype != dtype || it->second.shape.size() != rank) {
      std::cerr << "tessera-cli: import: array '" << name << "' must be " << dtype << " of rank "
                << rank << "\n";
      std::exit(1);
    }
    return &it->second;
  };
  const auto* ids = need("ids", "<i8", 1);
  const auto* weights = need("weights", "<f4", 2);
  if (ids == nullptr || weights == nullptr) {
    std::cerr << "tessera-cli: import: " << in << " needs arrays 'ids' and 'weights'\n";
    return 1;
  }
  const auto* state = need("state", "<f4", 2);
  const auto* last_steps = need("last_step", "<i8", 1);
  const auto* update_counts = need("update_count", "<i8", 1);
  const int64_t n = ids->shape[0];
  if (weights->shape[0] != n || (state != nullptr && state->shape[0] != n) ||
      (last_steps != nullptr && last_steps->shape[0] != n) ||
      (update_counts != nullptr && update_counts->shape[0] != n)) {
    std::cerr << "tessera-cli: import: every array must have one row per id (" << n << ")\n";
    return 1;
  }
  const int64_t dim = weights->shape[1];
  const int64_t sf = state != nullptr ? state->shape[1] : 0;
  constexpr int64_t kRows = 1 << 16;  // rows per request
  for (int64_t begin = 0; begin < n; begin += kRows) {
    const int64_t count = std::min(kRows, n - begin);
    tessera::v1::ImportRowsRequest req;
    req.set_table(table);
    auto* rows = req.mutable_rows();
    rows->set_dim(static_cast<int32_t>(dim));
    rows->set_ids(ids->data.substr(begin * 8, count * 8));
    rows->set_weights(weights->data.substr(begin * dim * 4, count * dim * 4));
    if (state != nullptr) {
      rows->set_state_floats(static_cast<int32_t>(sf));
      rows->set_state(state->data.substr(begin * sf * 4, count * sf * 4));
    }
    if (last_steps != nullptr) rows->set_last_steps(last_steps->data.substr(begin * 8, count * 8));
    if (update_counts != nullptr) {
      rows->set_update_counts(update_counts->data.substr(begin * 8, count * 8));
    }
    auto ctx = Context();
    tessera::v1::ImportRowsResponse resp;
    grpc::Status s = stub.ImportRows(ctx.get(), req, &resp);
    if (!s.ok()) {
      return Fail(absl::StrCat("import (", begin, " of ", n, " rows stored before this)"), s);
    }
  }
  std::printf("imported %lld rows into table '%s' (dim %lld%s)\n", static_cast<long long>(n),
              table.c_str(), static_cast<long long>(dim),
              state != nullptr ? ", with optimizer state" : "");
  return 0;
}

int Health() {
  std::string address = absl::GetFlag(FLAGS_address);
  if (address.empty()) address = absl::GetFlag(FLAGS_coordinator);
  auto stub = grpc::health::v1::Health::NewStub(Channel(address));
  auto ctx = Context();
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = stub->Check(ctx.get(), {}, &resp);
  if (!s.ok()) return Fail(absl::StrCat("health of ", address), s);
  const bool serving = resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  std::printf("%s: %s\n", address.c_str(), serving ? "SERVING" : "NOT_SERVING");
  return serving ? 0 : 1;
}

// 1234567 -> "1,234,567".
std::string Thousands(int64_t n) {
  const std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out = n < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string Bytes(int64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrCat(n, " B") : absl::StrFormat("%.1f %s", v, units[u]);
}

// Per table: its config, then one line per shard (address, health, rows and their share,
// memory, traffic, evictions) and a total, so skew and a down shard stand out.
void PrintStats(Coordinator::Stub& stub, const tessera::v1::StatsResponse& resp) {
  tessera::v1::ListTablesResponse tables;
  tessera::v1::ShardMap map;
  (void)stub.ListTables(Context().get(), {}, &tables);
  (void)stub.GetShardMap(Context().get(), {}, &map);
  std::map<std::string, std::vector<const tessera::v1::TableStats*>> by_table;
  for (const auto& t : resp.tables()) by_table[t.table()].push_back(&t);
  for (const tessera::v1::TableConfig& c : TablesOfModel(tables)) {
    const std::string& name = c.name();
    if (by_table.count(name) == 0) continue;  // not asked for (--table)
    const auto& shards = by_table[name];
    const std::string about = absl::StrCat(
        "dim ", c.dim(), ", ", tessera::embedding::DtypeName(c.dtype()), ", ",
        tessera::embedding::OptimizerName(c.optimizer().type()),
        c.max_rows() > 0 ? absl::StrCat(", max_rows ", Thousands(c.max_rows())) : "");
    std::printf("table %s (%s)\n", name.c_str(), about.c_str());
    std::printf("  %-5s %-22s %-8s %15s %6s %11s %15s %15s %11s\n", "shard", "address", "state",
                "rows", "share", "memory", "lookups", "updates", "evictions");
    tessera::v1::TableStats total;
    for (const auto* t : shards) {
      total.set_rows(total.rows() + t->rows());
      total.set_memory_bytes(total.memory_bytes() + t->memory_bytes());
      total.set_lookups(total.lookups() + t->lookups());
      total.set_updates(total.updates() + t->updates());
      total.set_evictions(total.evictions() + t->evictions());
    }
    // Shards of the map that sent nothing (down) are listed too.
    for (int k = 0; k < map.shards_size(); ++k) {
      bool reported = false;
      for (const auto* t : shards) reported = reported || t->shard_index() == k;
      if (!reported) {
        std::printf("  %-5d %-22s %-8s %15s\n", k, map.shards(k).address().c_str(),
                    map.shards(k).serving() ? "SERVING" : "DOWN", "-");
      }
    }
    for (const auto* t : shards) {
      std::string address = "?", state = "?";
      if (t->shard_index() < map.shards_size()) {
        address = map.shards(t->shard_index()).address();
        state = map.shards(t->shard_index()).serving() ? "SERVING" : "DOWN";
      }
      const double share = total.rows() > 0 ? 100.0 * t->rows() / total.rows() : 0.0;
      std::printf("  %-5d %-22s %-8s %15s %5.1f%% %11s %15s %15s %11s\n", t->shard_index(),
                  address.c_str(), state.c_str(), Thousands(t->rows()).c_str(), share,
                  Bytes(t->memory_bytes()).c_str(), Thousands(t->lookups()).c_str(),
                  Thousands(t->updates()).c_str(), Thousands(t->evictions()).c_str());
    }
    std::printf("  %-5s %-22s %-8s %15s %6s %11s %15s %15s %11s\n", "all", "", "",
                Thousands(total.rows()).c_str(), "", Bytes(total.memory_bytes()).c_str(),
                Thousands(total.lookups()).c_str(), Thousands(total.updates()).c_str(),
                Thousands(total.evictions()).c_str());
  }
}

// Creates every table of --tables_file; a table that exists with the same config is left
// as it is, one with another config is an error (nothing is changed).
int Apply(Coordinator::Stub& stub) {
  const std::string path = absl::GetFlag(FLAGS_tables_file);
  std::ifstream in(path);
  if (path.empty() || !in) {
    std::cerr << "tessera-cli: apply needs a readable --tables_file, got '" << path << "'\n";
    return 1;
  }
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  tessera::v1::ListTablesResponse wanted;
  const auto parsed = google::protobuf::util::JsonStringToMessage(text, &wanted);
  if (!parsed.ok()) {
    std::cerr << "tessera-cli: " << path << ": " << parsed.ToString() << "\n";
    return 1;
  }
  tessera::v1::ListTablesResponse existing;
  grpc::Status s = stub.ListTables(Context().get(), {}, &existing);
  if (!s.ok()) return Fail("apply", s);
  int failures = 0;
  for (const auto& config : wanted.tables()) {
    const tessera::v1::TableConfig* have = nullptr;
    for (const auto& t : existing.tables()) {
      if (t.name() == config.name()) have = &t;
    }
    if (have != nullptr) {
      if (google::protobuf::util::MessageDifferencer::Equals(*have, config)) {
        std::printf("table '%s': unchanged\n", config.name().c_str());
      } else {
        std::fprintf(stderr, "tessera-cli: table '%s' exists with another config: %s\n",
                     config.name().c_str(), have->ShortDebugString().c_str());
        ++failures;
      }
      continue;
    }
    tessera::v1::CreateTableRequest req;
    *req.mutable_config() = config;
    tessera::v1::CreateTableResponse resp;
    s = stub.CreateTable(Context().get(), req, &resp);
    if (!s.ok()) {
      Fail(absl::StrCat("create '", config.name(), "'"), s);
      ++failures;
      continue;
    }
    std::printf("table '%s': created (dim %d, %s)\n", config.name().c_str(), config.dim(),
                tessera::embedding::DtypeName(config.dtype()).c_str());
  }
  return failures == 0 ? 0 : 1;
}

void PrintTableList(const char* what,
                    const google::protobuf::RepeatedPtrField<std::string>& names) {
  std::vector<std::string> sorted(names.begin(), names.end());
  std::sort(sorted.begin(), sorted.end(), NaturalLess);
  std::printf("  %s (%zu): %s\n", what, sorted.size(),
              sorted.empty() ? "none" : absl::StrJoin(sorted, ", ").c_str());
}

// One model's checkpoint, or with --all_models every model's: a restore rolls tables back,
// so one without a model must say so.
int Restore(Coordinator::Stub& stub) {
  const std::string model = absl::GetFlag(FLAGS_model);
  const bool all_models = absl::GetFlag(FLAGS_all_models);
  if (model.empty() == !all_models) {
    std::cerr << "tessera-cli: restore needs --model=NAME (that model's tables only) or "
                 "--all_models (every model of the cluster back to an operator's whole-cluster "
                 "checkpoint), not both\n";
    return 1;
  }
  tessera::v1::RestoreRequest req;
  req.set_step(absl::GetFlag(FLAGS_step));
  req.set_model(model);
  req.set_all_models(all_models);
  auto ctx = Context(kCheckpointDeadlineMs);
  tessera::v1::RestoreResponse resp;
  grpc::Status s = stub.Restore(ctx.get(), req, &resp);
  if (!s.ok()) return Fail("restore", s);
  std::printf("restored: ");
  PrintCheckpoint(resp.checkpoint());
  PrintTableList("rolled back", resp.rolled_back());
  PrintTableList("brought back", resp.brought_back());
  PrintTableList("dropped", resp.dropped());
  return 0;
}

// Moves the cluster to the shards of --shards while it trains on.
int Reshard(Coordinator::Stub& stub) {
  const std::vector<std::string> shards =
      absl::StrSplit(absl::GetFlag(FLAGS_shards), ',', absl::SkipEmpty());
  if (shards.empty()) {
    std::cerr << "tessera-cli: reshard needs --shards=host:port,... (the new map's shards, in "
                 "shard order)\n";
    return 1;
  }
  tessera::v1::ReshardClusterRequest req;
  for (const std::string& a : shards) req.add_shards(a);
  auto ctx = Context(kCheckpointDeadlineMs);
  tessera::v1::ReshardClusterResponse resp;
  grpc::Status s = stub.Reshard(ctx.get(), req, &resp);
  if (!s.ok()) return Fail("reshard", s);
  std::printf("resharded: %zu shards, shard map version %llu; %lld rows moved in %.1f s (rows "
              "updated meanwhile copied again: %lld while serving, %lld while pushes waited "
              "%.2f s), %lld applied pushes handed over\n",
              shards.size(), static_cast<unsigned long long>(resp.version()),
              static_cast<long long>(resp.rows_moved()), resp.seconds(),
              static_cast<long long>(resp.rows_caught_up()),
              static_cast<long long>(resp.rows_copied_again()), resp.frozen_seconds(),
              static_cast<long long>(resp.pushes_kept()));
  return 0;
}

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

// Changes an existing table's optimizer settings to the flags given; prints the table's
// settings before and after.
int Alter(Coordinator::Stub& stub, const std::string& table) {
  const tessera::v1::OptimizerConfig changes = OptimizerChanges();
  const absl::CommandLineFlag* type = absl::FindCommandLineFlag("optimizer");
  if (changes.ByteSizeLong() == 0 && type != nullptr &&
      type->CurrentValue() != type->DefaultValue()) {
    // The rows' optimizer state is the type's: it cannot change under them.
    std::cerr << "tessera-cli: alter cannot change a table's optimizer type (--optimizer is "
                 "create's: a table keeps the type it was made with, as its rows' optimizer "
                 "state is that type's); give the settings to change (--lr, --epsilon, ...), or "
                 "make a new table of that type and import the weights (export, create, "
                 "import)\n";
    return 1;
  }
  if (table.empty() || changes.ByteSizeLong() == 0) {
    std::vector<const char*> flags;
    for (const auto& setting : kOptimizerSettings) flags.push_back(setting.first);
    std::cerr << "tessera-cli: alter needs --table=NAME and at least one optimizer setting ("
              << absl::StrJoin(flags, ", ") << ")\n";
    return 1;
  }
  // Settings the table's optimizer would ignore are refused (a table not listed is left to
  // the coordinator to name).
  if (tessera::v1::ListTablesResponse listed; stub.ListTables(Context().get(), {}, &listed).ok()) {
    for (const tessera::v1::TableConfig& t : listed.tables()) {
      if (t.name() == table && !SettingsTakeEffect("alter", changes, t.optimizer().type())) {
        return 1;
      }
    }
  }
  tessera::v1::AlterTableRequest req;
  req.set_table(table);
  *req.mutable_optimizer() = changes;
  tessera::v1::AlterTableResponse resp;
  grpc::Status s = stub.AlterTable(Context().get(), req, &resp);
  if (!s.ok()) return Fail("alter", s);
  std::printf("altered table '%s': optimizer %s\n", table.c_str(),
              resp.config().optimizer().ShortDebugString().c_str());
  return 0;
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

int Create(Coordinator::Stub& stub, const std::string& table) {
  if (table.empty()) {
    std::cerr << "tessera-cli: create needs --table=NAME (and --dim)\n";
    return 1;
  }
  absl::StatusOr<tessera::v1::TableConfig> config = CreateConfig(table);
  if (!config.ok()) {
    std::cerr << "tessera-cli: " << config.status().message() << "\n";
    return 1;
  }
  if (!SettingsTakeEffect("create", config->optimizer(), config->optimizer().type())) return 1;
  tessera::v1::CreateTableRequest req;
  *req.mutable_config() = *config;
  tessera::v1::CreateTableResponse resp;
  grpc::Status s = stub.CreateTable(Context().get(), req, &resp);
  if (!s.ok()) return Fail("create", s);
  std::printf("created table '%s' (dim %d)\n", table.c_str(), config->dim());
  return 0;
}

int Tables(Coordinator::Stub& stub, const std::string&) {
  auto ctx = Context();
  tessera::v1::ListTablesResponse resp;
  grpc::Status s = stub.ListTables(ctx.get(), {}, &resp);
  if (!s.ok()) return Fail("tables", s);
  std::printf("%-20s %6s %-5s %-16s %10s %12s\n", "table", "dim", "dtype", "optimizer", "lr",
              "max_rows");
  for (const auto& t : TablesOfModel(resp)) {
    std::printf("%-20s %6d %-5s %-16s %10g %12lld\n", t.name().c_str(), t.dim(),
                tessera::embedding::DtypeName(t.dtype()).c_str(),
                tessera::embedding::OptimizerName(t.optimizer().type()).c_str(),
                t.optimizer().learning_rate(), static_cast<long long>(t.max_rows()));
  }
  return 0;
}

// --ids into `req`: ids are 64-bit patterns, so an unsigned hash names the int64 of the
// same bits. False (with a message) for a bad id.
bool ParseIds(tessera::v1::LookupRequest* req) {
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_ids), ',', absl::SkipEmpty())) {
    int64_t id = 0;
    uint64_t unsigned_id = 0;
    if (absl::SimpleAtoi(part, &id)) {
      req->add_ids(id);
    } else if (absl::SimpleAtoi(part, &unsigned_id)) {
      req->add_ids(static_cast<int64_t>(unsigned_id));
    } else {
      std::cerr << "tessera-cli: --ids: bad id '" << part << "'\n";
      return false;
    }
  }
  return true;
}

int Lookup(Coordinator::Stub& stub, const std::string& table) {
  if (table.empty() || absl::GetFlag(FLAGS_ids).empty()) {
    std::cerr << "tessera-cli: lookup needs --table=NAME and --ids=ID,ID,... (read only: "
                 "ids never stored show their initial weights)\n";
    return 1;
  }
  tessera::v1::LookupRequest req;
  req.set_table(table);
  req.set_read_only(true);
  if (!ParseIds(&req)) return 1;
  auto ctx = Context();
  tessera::v1::LookupResponse resp;
  grpc::Status s = stub.Lookup(ctx.get(), req, &resp);
  if (!s.ok()) return Fail("lookup", s);
  for (int i = 0; i < req.ids_size(); ++i) {
    std::printf("%lld:", static_cast<long long>(req.ids(i)));
    for (int j = 0; j < resp.dim(); ++j) std::printf(" %.6f", resp.values(i * resp.dim() + j));
    std::printf("\n");
  }
  return 0;
}

// Per shard with a memory budget (--memory_limit): the bytes its rows take of it.
void PrintMemoryBudgets(const tessera::v1::StatsResponse& resp) {
  std::map<int, const tessera::v1::TableStats*> by_shard;  // any of its tables
  for (const auto& t : resp.tables()) {
    if (t.memory_budget_bytes() > 0) by_shard.emplace(t.shard_index(), &t);
  }
  for (const auto& [shard, t] : by_shard) {
    std::printf("shard %d memory budget: %s of %s taken by rows (%.1f%%)\n", shard,
                Bytes(t->memory_budget_used_bytes()).c_str(),
                Bytes(t->memory_budget_bytes()).c_str(),
                100.0 * t->memory_budget_used_bytes() / t->memory_budget_bytes());
  }
}

// Per table with feature admission at work: the gradients it dropped for ids not admitted.
void PrintAdmission(const tessera::v1::StatsResponse& resp) {
  std::map<std::string, int64_t> refused;
  for (const auto& t : resp.tables()) {
    if (t.admission_refused() > 0) refused[t.table()] += t.admission_refused();
  }
  for (const auto& [name, n] : refused) {
    std::printf("table %s admission: %lld gradient(s) of ids not admitted yet dropped\n",
                name.c_str(), static_cast<long long>(n));
  }
}

int Stats(Coordinator::Stub& stub, const std::string& table) {
  tessera::v1::StatsRequest req;
  req.set_table(table);
  auto ctx = Context();
  tessera::v1::StatsResponse resp;
  grpc::Status s = stub.Stats(ctx.get(), req, &resp);
  if (!s.ok()) return Fail("stats", s);
  PrintStats(stub, resp);
  PrintMemoryBudgets(resp);
  PrintAdmission(resp);
  for (const auto& c : resp.checkpoints()) {
    std::printf("checkpoint ");
    PrintCheckpoint(c);
  }
  return 0;
}

int TakeCheckpoint(Coordinator::Stub& stub, const std::string&) {
  const int64_t step = absl::GetFlag(FLAGS_step);
  if (step < 0) {
    std::cerr << (step == -1 ? "tessera-cli: checkpoint needs --step (the training step it is "
                               "taken at)\n"
                             : absl::StrCat("tessera-cli: checkpoint --step must be >= 0, got ",
                                            step, "\n"));
    return 1;
  }
  tessera::v1::CheckpointRequest req;
  req.set_step(step);
  req.set_model(absl::GetFlag(FLAGS_model));
  auto ctx = Context(kCheckpointDeadlineMs);
  tessera::v1::CheckpointResponse resp;
  grpc::Status s = stub.Checkpoint(ctx.get(), req, &resp);
  if (!s.ok()) return Fail("checkpoint", s);
  std::printf("checkpoint taken: ");
  PrintCheckpoint(resp.checkpoint());
  return 0;
}

int Checkpoints(Coordinator::Stub& stub, const std::string&) {
  auto ctx = Context();
  tessera::v1::ListCheckpointsResponse resp;
  grpc::Status s = stub.ListCheckpoints(ctx.get(), {}, &resp);
  if (!s.ok()) return Fail("checkpoints", s);
  if (resp.checkpoints_size() == 0) std::printf("no complete checkpoints\n");
  for (const auto& c : resp.checkpoints()) PrintCheckpoint(c);
  return 0;
}

int Drop(Coordinator::Stub& stub, const std::string& table) {
  std::vector<std::string> names;
  const std::string model = absl::GetFlag(FLAGS_model);
  if (!table.empty()) {
    names.push_back(table);
  } else if (!model.empty()) {
    auto ctx = Context();
    tessera::v1::ListTablesResponse resp;
    grpc::Status s = stub.ListTables(ctx.get(), {}, &resp);
    if (!s.ok()) return Fail("drop", s);
    for (const auto& t : resp.tables()) {
      if (tessera::embedding::TableOfModel(t.name(), model)) names.push_back(t.name());
    }
    if (names.empty()) std::printf("model '%s' has no tables\n", model.c_str());
  } else {
    std::cerr << "tessera-cli: drop needs --table=NAME, or --model=NAME for all its tables\n";
    return 1;
  }
  for (const std::string& name : names) {
    tessera::v1::DropTableRequest req;
    req.set_table(name);
    tessera::v1::DropTableResponse resp;
    auto ctx = Context();
    grpc::Status s = stub.DropTable(ctx.get(), req, &resp);
    if (!s.ok()) return Fail(absl::StrCat("drop ", name), s);
    std::printf("dropped table '%s'\n", name.c_str());
  }
  return 0;
}

int PrintShardMap(Coordinator::Stub& stub, const std::string&) {
  auto ctx = Context();
  tessera::v1::ShardMap map;
  grpc::Status s = stub.GetShardMap(ctx.get(), {}, &map);
  if (!s.ok()) return Fail("shardmap", s);
  std::printf("version %llu\n", static_cast<unsigned long long>(map.version()));
  for (const auto& sh : map.shards()) {
    std::printf("shard %d  %s  %s\n", sh.index(), sh.address().c_str(),
                sh.serving() ? "serving" : "DOWN");
  }
  return 0;
}

// Every command, in the order usage lists them; each gets the coordinator's stub and
// --table. health is answered before a stub is made.
struct Command {
  const char* name;
  int (*run)(Coordinator::Stub& stub, const std::string& table);
};
constexpr Command kCommands[] = {
    {"health", nullptr},
    {"tables", Tables},
    {"apply", [](Coordinator::Stub& stub, const std::string&) { return Apply(stub); }},
    {"create", Create},
    {"alter", Alter},
    {"drop", Drop},
    {"lookup", Lookup},
    {"stats", Stats},
    {"shardmap", PrintShardMap},
    {"checkpoint", TakeCheckpoint},
    {"restore", [](Coordinator::Stub& stub, const std::string&) { return Restore(stub); }},
    {"checkpoints", Checkpoints},
    {"export", Export},
    {"import", Import},
    {"reshard", [](Coordinator::Stub& stub, const std::string&) { return Reshard(stub); }},
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
  if (command == "health") return Health();
  for (const Command& c : kCommands) {
    if (command != c.name || c.run == nullptr) continue;
    auto stub = Coordinator::NewStub(Channel(absl::GetFlag(FLAGS_coordinator)));
    return c.run(*stub, absl::GetFlag(FLAGS_table));
  }
  std::cerr << "tessera-cli: unknown command '" << command << "'; expected "
            << CommandNames(", ", " or ") << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage = "tessera-cli [flags] " + CommandNames("|", "|");
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
  Security() = *security;
  return Run(rest[1]);
}
