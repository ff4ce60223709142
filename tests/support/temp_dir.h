#ifndef TESSERA_TESTS_SUPPORT_TEMP_DIR_H_
#define TESSERA_TESTS_SUPPORT_TEMP_DIR_H_

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace tessera::testing {

// A fresh directory under the system's temporary directory, removed with everything in it
// when this goes out of scope.
class ScopedTempDir {
 public:
  explicit ScopedTempDir(const std::string& prefix = "tessera")
      : path((std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string()) {
    if (::mkdtemp(path.data()) == nullptr) path.clear();
  }
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
