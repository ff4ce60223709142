// tessera-cli stats.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "embedding/collection.h"
#include "embedding/dtype.h"
#include "embedding/optimizer.h"
#include "tools/cli/cli.h"
#include "wire/checkpoint_proto.h"

namespace tessera::cli {

namespace {

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
void PrintStats(client::EmbeddingClient& client, const tessera::v1::StatsResponse& resp) {
  const tessera::v1::ShardMap map = client.ShardMap().value_or(tessera::v1::ShardMap());
  const std::vector<tessera::v1::TableConfig> tables =
      client.ListTables().value_or(std::vector<tessera::v1::TableConfig>());
  std::map<std::string, std::vector<const tessera::v1::TableStats*>> by_table;
  for (const auto& t : resp.tables()) by_table[t.table()].push_back(&t);
  for (const tessera::v1::TableConfig& c : TablesOfModel(tables)) {
    const std::string& name = c.name();
    if (by_table.count(name) == 0) continue;  // not asked for (--table)
    const auto& shards = by_table[name];
    const std::string about =
        absl::StrCat("dim ", c.dim(), ", ", tessera::embedding::DtypeName(c.dtype()), ", ",
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

}  // namespace

int Stats(client::EmbeddingClient& tables, const std::string& table) {
  absl::StatusOr<tessera::v1::StatsResponse> resp = tables.Stats(table);
  if (!resp.ok()) return Fail("stats", resp.status());
  PrintStats(tables, *resp);
  PrintMemoryBudgets(*resp);
  PrintAdmission(*resp);
  for (const auto& c : resp->checkpoints()) {
    std::printf("checkpoint ");
    PrintCheckpoint(wire::FromProto(c));
  }
  return 0;
}

}  // namespace tessera::cli
