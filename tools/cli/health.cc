// tessera-cli health.
#include <chrono>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/health_check.h"
#include "tools/cli/cli.h"

namespace tessera::cli {

int Health(const std::string& address) {
  absl::StatusOr<bool> serving = client::IsServing(
      address, Security(), std::chrono::milliseconds(absl::GetFlag(FLAGS_deadline_ms)));
  if (!serving.ok()) return Fail(absl::StrCat("health of ", address), serving.status());
  std::printf("%s: %s\n", address.c_str(), *serving ? "SERVING" : "NOT_SERVING");
  return *serving ? 0 : 1;
}

}  // namespace tessera::cli
