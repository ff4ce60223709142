// tessera-cli: what its commands share.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/time/time.h"
#include "embedding/collection.h"
#include "tools/cli/cli.h"
#include "wire/grpc_status.h"

namespace tessera::cli {

// TLS and token from the shared flags (wire/security_flags.h), loaded in main().
tessera::wire::ClientSecurity& Security() {
  static tessera::wire::ClientSecurity security;
  return security;
}

absl::StatusOr<std::unique_ptr<client::EmbeddingClient>> Client() {
  client::ClientOptions options;
  options.mode = client::ClientOptions::Mode::kCoordinator;
  options.deadline = std::chrono::milliseconds(absl::GetFlag(FLAGS_deadline_ms));
  options.retry.max_retries = 0;
  options.wait_for_coordinator = false;
  options.security = Security();
  return client::EmbeddingClient::Connect(absl::GetFlag(FLAGS_coordinator), options);
}

void PrintCheckpoint(const embedding::CheckpointInfo& c) {
  if (!c.model.empty()) std::printf("model %s ", c.model.c_str());
  const std::string created = absl::FormatTime(
      "%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(c.created_unix_ms), absl::UTCTimeZone());
  std::printf("step %lld: %lld rows, %lld bytes, %zu shard(s), created %s",
              static_cast<long long>(c.step), static_cast<long long>(c.rows),
              static_cast<long long>(c.bytes), c.shards.size(), created.c_str());
  if (c.seconds > 0) std::printf(", took %.2f s", c.seconds);
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
std::vector<tessera::v1::TableConfig> TablesOfModel(
    const std::vector<tessera::v1::TableConfig>& tables) {
  const std::string model = absl::GetFlag(FLAGS_model);
  std::vector<tessera::v1::TableConfig> out;
  for (const auto& t : tables) {
    if (tessera::embedding::TableOfModel(t.name(), model)) out.push_back(t);
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return NaturalLess(a.name(), b.name()); });
  return out;
}

int Refuse(absl::string_view message) {
  std::cerr << "tessera-cli: " << message << "\n";
  return 1;
}

int Fail(const std::string& what, const absl::Status& s) {
  // Calls go to the coordinator but for `health --address`: say what a shard or a TLS
  // mismatch looks like.
  absl::Status explained =
      tessera::wire::ExplainCoordinatorFailure(s, absl::GetFlag(FLAGS_coordinator), Security());
  std::cerr << "tessera-cli: " << what << ": " << absl::StatusCodeToString(explained.code()) << ": "
            << explained.message() << "\n";
  return 1;
}

}  // namespace tessera::cli
