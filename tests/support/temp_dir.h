#ifndef TESSERA_TESTS_SUPPORT_TEMP_DIR_H_
#define TESSERA_TESTS_SUPPORT_TEMP_DIR_H_

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace tessera::testing {

// A fresh directory PREFIX-XXXXXX under the system's temporary directory, left for the
// caller to remove (a store reopened by another harness outlives the test that made it);
// empty when it cannot be made.
inline std::string MakeTempDir(const std::string& prefix = "tessera") {
  std::string path = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  if (::mkdtemp(path.data()) == nullptr) path.clear();
  return path;
}

// A directory of this process's own, made at its first call and the same after: two
// suites running at once on one machine must not write each other's files.
inline const std::string& ProcessScratchDir() {
  static const std::string dir = MakeTempDir("tessera-scratch");
  return dir;
}

// A fresh directory under the system's temporary directory, removed with everything in it
// when this goes out of scope.
class ScopedTempDir {
 public:
  explicit ScopedTempDir(const std::string& prefix = "tessera") : path(MakeTempDir(prefix)) {}
  ~ScopedTempDir() {
    std::error_code ignored;
    if (!path.empty()) std::filesystem::remove_all(path, ignored);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  std::string path;  // empty when the directory could not be made
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_SUPPORT_TEMP_DIR_H_
