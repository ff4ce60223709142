#ifndef TESSERA_TOOLS_NPZ_H_
#define TESSERA_TOOLS_NPZ_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::tools {

// One array of a NumPy .npz file: little-endian int64 ('<i8', or '<u8' read as the same
// bits) or float32 ('<f4'), C order.
struct NpyArray {
  std::string dtype;             // "<i8" or "<f4"
  std::vector<int64_t> shape;    // e.g. {rows, dim}
  std::string data;              // the values' bytes
  int64_t elements() const;
};

// Writes `arrays` as an uncompressed .npz (what np.savez writes; np.load reads it).
// InvalidArgument for a bad dtype or a data size that does not match the shape, Internal
// when the file cannot be written.
absl::Status WriteNpz(const std::string& path, const std::map<std::string, NpyArray>& arrays);

// Reads an uncompressed .npz (np.savez's, zip64 entries included). NotFound when the file
// is missing; InvalidArgument for a compressed one (np.savez_compressed), a dtype other
// than int64 / uint64 / float32, Fortran order, or a malformed file.
absl::StatusOr<std::map<std::string, NpyArray>> ReadNpz(const std::string& path);

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_NPZ_H_
