#ifndef TESSERA_WIRE_PACKED_BYTES_H_
#define TESSERA_WIRE_PACKED_BYTES_H_

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tessera::wire {

// Packed little-endian arrays in protobuf `bytes` fields (int64 ids, int32 offsets, fp32
// values): the batched wire form, one memcpy each way instead of a varint per element.
static_assert(std::endian::native == std::endian::little,
              "the packed wire form is little-endian, as is this host's memory");

// Writes `values` into `out` (replacing what it held).
template <typename T>
void SetPacked(absl::Span<const T> values, std::string* out) {
  out->assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

// Sizes `out` for n values and returns where to write them. std::string's buffer is
// aligned for any T up to 8 bytes (heap: malloc's alignment; short: inside the object).
template <typename T>
T* ResizePacked(std::string* out, size_t n) {
  out->resize(n * sizeof(T));
  return reinterpret_cast<T*>(out->data());
}

// The values held by `bytes`, as a span over them where they are aligned for T (always,
// for a parsed message's own string) or over a copy in `scratch` otherwise.
// InvalidArgument naming `what` when the size is not a whole number of values.
template <typename T>
absl::StatusOr<absl::Span<const T>> PackedSpan(absl::string_view bytes, absl::string_view what,
                                               std::vector<T>* scratch) {
  if (bytes.size() % sizeof(T) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", bytes.size(),
                                                   " bytes is not a whole number of ",
                                                   sizeof(T), "-byte values"));
  }
  const size_t n = bytes.size() / sizeof(T);
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(T) == 0) {
    return absl::Span<const T>(reinterpret_cast<const T*>(bytes.data()), n);
  }
  scratch->resize(n);
  if (n > 0) std::memcpy(scratch->data(), bytes.data(), bytes.size());
  return absl::Span<const T>(scratch->data(), n);
}

}  // namespace tessera::wire

#endif  // TESSERA_WIRE_PACKED_BYTES_H_
