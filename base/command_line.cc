#include "base/command_line.h"

#include <string>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/process_settings.h"

namespace tessera::base {
namespace {

// Flags defined in the project's own sources. Each flag knows the file that defined it,
// compiled in relative to the source tree (-ffile-prefix-map, so no build machine's path
// shows): "trainer/train_main.cc", where abseil's own are absolute.
bool IsTesseraSource(absl::string_view file) {
  for (absl::string_view dir : {"base/", "benchmarks/", "client/", "embedding/", "observability/",
                                "server/", "tools/", "trainer/", "tests/", "wire/"}) {
    if (absl::StartsWith(file, dir)) return true;
  }
  return false;
}

}  // namespace

absl::string_view TesseraVersion() { return TESSERA_VERSION; }

std::vector<char*> ParseCommandLine(int argc, char** argv, absl::string_view program,
                                    absl::string_view usage) {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = IsTesseraSource;
  config.contains_helpshort_flags = IsTesseraSource;
  const std::string name(program);
  config.version_string = [name] { return absl::StrCat(name, " ", TESSERA_VERSION, "\n"); };
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
  DisableMutexDeadlockDetection();
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace tessera::base
