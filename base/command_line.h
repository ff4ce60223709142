#ifndef TESSERA_BASE_COMMAND_LINE_H_
#define TESSERA_BASE_COMMAND_LINE_H_

#include <vector>

#include "absl/strings/string_view.h"

namespace tessera::base {

// The version every binary prints with --version (the project's CMake version).
absl::string_view TesseraVersion();

// Parses the command line of a Tessera binary named `program`: --help lists the flags
// defined in Tessera's own sources (the binary's and those of the libraries it links, not
// abseil's or gRPC's), --version prints "program version", and `usage` heads the help.
// Exits on bad flags as absl::ParseCommandLine does; returns the positional arguments
// (argv[0] first). Also turns off abseil's mutex deadlock detection for the process
// (base/process_settings.h): every binary's main() calls this first.
std::vector<char*> ParseCommandLine(int argc, char** argv, absl::string_view program,
                                    absl::string_view usage);

}  // namespace tessera::base

#endif  // TESSERA_BASE_COMMAND_LINE_H_
