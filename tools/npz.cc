#include "tools/npz.h"

#include <zlib.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tessera::tools {
namespace {

constexpr char kNpyMagic[] = "\x93NUMPY";

void Put16(std::string* out, uint32_t v) {
  out->push_back(static_cast<char>(v & 0xff));
  out->push_back(static_cast<char>((v >> 8) & 0xff));
}
void Put32(std::string* out, uint32_t v) {
  Put16(out, v & 0xffff);
  Put16(out, v >> 16);
}
uint32_t Get16(const std::string& s, size_t at) {
  return static_cast<uint32_t>(static_cast<unsigned char>(s[at])) |
         static_cast<uint32_t>(static_cast<unsigned char>(s[at + 1])) << 8;
}
uint32_t Get32(const std::string& s, size_t at) { return Get16(s, at) | Get16(s, at + 2) << 16; }
uint64_t Get64(const std::string& s, size_t at) {
  return static_cast<uint64_t>(Get32(s, at)) | static_cast<uint64_t>(Get32(s, at + 4)) << 32;
}

size_t ItemSize(const std::string& dtype) { return dtype == "<f4" ? 4 : 8; }

// The .npy form of `a`: magic, version 1.0, a header padded so the data starts on a
// 64-byte boundary, the data.
std::string Npy(const NpyArray& a) {
  std::string shape = "(";
  for (size_t i = 0; i < a.shape.size(); ++i) {
    absl::StrAppend(&shape, a.shape[i],
                    a.shape.size() == 1 ? "," : (i + 1 < a.shape.size() ? ", " : ""));
  }
  shape += ")";
  std::string header =
      absl::StrCat("{'descr': '", a.dtype, "', 'fortran_order': False, 'shape': ", shape, ", }");
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string out(kNpyMagic, 6);
  out.push_back('\x01');
  out.push_back('\x00');
  Put16(&out, static_cast<uint32_t>(header.size()));
  out += header;
  out += a.data;
  return out;
}

// A dtype a .npy file may store, read as int64 (ids: integers of any width; uint64 as
// the same 64 bits, as the Python client takes them) or float32 (weights: float16, 32 or
// 64, as np.ascontiguousarray(..., np.float32) takes them).
struct StoredDtype {
  const char* descr;
  size_t size;
  bool floating;
  bool is_signed;
};
constexpr StoredDtype kStoredDtypes[] = {
    {"<i8", 8, false, true},  {"<u8", 8, false, false}, {"<i4", 4, false, true},
    {"<u4", 4, false, false}, {"<i2", 2, false, true},  {"<u2", 2, false, false},
    {"|i1", 1, false, true},  {"|u1", 1, false, false}, {"<f4", 4, true, true},
    {"<f8", 8, true, true},   {"<f2", 2, true, true},
};

const StoredDtype* FindStoredDtype(absl::string_view descr) {
  for (const auto& d : kStoredDtypes) {
    if (descr == d.descr) return &d;
  }
  return nullptr;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const int exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | (static_cast<uint32_t>(exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = 113;
    while ((mantissa & 0x400) == 0) {
      mantissa <<= 1;
      --e;
    }
    bits = sign | (static_cast<uint32_t>(e) << 23) | ((mantissa & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// `n` values of `kind` as little-endian int64 or float32 bytes.
std::string Widen(const StoredDtype& kind, absl::string_view data, int64_t n) {
  if (kind.size == (kind.floating ? 4u : 8u)) return std::string(data);  // as stored
  std::string out(static_cast<size_t>(n) * (kind.floating ? 4 : 8), '\0');
  for (int64_t i = 0; i < n; ++i) {
    const char* v = data.data() + i * kind.size;
    if (kind.floating) {
      float f = 0;
      if (kind.size == 8) {
        double d;
        std::memcpy(&d, v, 8);
        f = static_cast<float>(d);
      } else {
        uint16_t h;
        std::memcpy(&h, v, 2);
        f = HalfToFloat(h);
      }
      std::memcpy(out.data() + i * 4, &f, 4);
      continue;
    }
    uint64_t raw = 0;
    std::memcpy(&raw, v, kind.size);
    int64_t x = static_cast<int64_t>(raw);
    if (kind.is_signed && kind.size < 8) {  // sign-extend
      const int shift = 64 - 8 * static_cast<int>(kind.size);
      x = static_cast<int64_t>(raw << shift) >> shift;
    }
    std::memcpy(out.data() + i * 8, &x, 8);
  }
  return out;
}

absl::StatusOr<NpyArray> ParseNpy(const std::string& name, const std::string& bytes) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("npz entry '", name, "': ", why));
  };
  if (bytes.size() < 10 || bytes.compare(0, 6, kNpyMagic, 6) != 0) return bad("not a .npy array");
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len = 0, at = 0;
  if (major == 1) {
    header_len = Get16(bytes, 8);
    at = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return bad("truncated header");
    header_len = Get32(bytes, 8);
    at = 12;
  } else {
    return bad(absl::StrCat("unknown .npy version ", major));
  }
  if (at + header_len > bytes.size()) return bad("truncated header");
  const std::string header = bytes.substr(at, header_len);
  NpyArray a;
  auto field = [&](absl::string_view key) -> std::string {
    const size_t k = header.find(absl::StrCat("'", key, "':"));
    if (k == std::string::npos) return "";
    size_t v = k + key.size() + 3;
    while (v < header.size() && header[v] == ' ') ++v;
    if (header[v] == '\'') return header.substr(v + 1, header.find('\'', v + 1) - v - 1);
    if (header[v] == '(') return header.substr(v + 1, header.find(')', v) - v - 1);
    return header.substr(v, header.find_first_of(",}", v) - v);
  };
  const std::string stored = field("descr");
  const auto* kind = FindStoredDtype(stored);
  if (kind == nullptr) {
    return bad(absl::StrCat("dtype '", stored,
                            "' (little-endian integers or float16/32/64 expected)"));
  }
  if (field("fortran_order") != "False") return bad("Fortran order is not supported");
  for (absl::string_view d : absl::StrSplit(field("shape"), ',', absl::SkipWhitespace())) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(d), &n) || n < 0) return bad("bad shape");
    a.shape.push_back(n);
  }
  const absl::string_view data = absl::string_view(bytes).substr(at + header_len);
  if (data.size() != static_cast<size_t>(a.elements()) * kind->size) {
    return bad(absl::StrCat(data.size(), " data bytes for shape (",
                            absl::StrJoin(a.shape, ", "), ")"));
  }
  a.dtype = kind->floating ? "<f4" : "<i8";
  a.data = Widen(*kind, data, a.elements());
  return a;
}

}  // namespace

int64_t NpyArray::elements() const {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

absl::Status WriteNpz(const std::string& path, const std::map<std::string, NpyArray>& arrays) {
  std::string out, directory;
  for (const auto& [name, a] : arrays) {
    if (a.dtype != "<i8" && a.dtype != "<f4") {
      return absl::InvalidArgumentError(absl::StrCat("array '", name, "': dtype ", a.dtype));
    }
    if (a.data.size() != static_cast<size_t>(a.elements()) * ItemSize(a.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("array '", name, "': ", a.data.size(),
                                                     " bytes do not fill its shape"));
    }
    const std::string file = name + ".npy";
    const std::string body = Npy(a);
    if (body.size() >= 0xffffffffu || out.size() >= 0xffffffffu) {
      return absl::InvalidArgumentError(
          absl::StrCat("array '", name, "' is over 4 GiB: export fewer rows (--since_step)"));
    }
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size())));
    const uint32_t offset = static_cast<uint32_t>(out.size());
    // Local file header: stored (no compression), no data descriptor.
    Put32(&out, 0x04034b50);
    Put16(&out, 20);
    Put16(&out, 0);
    Put16(&out, 0);
    Put16(&out, 0);
    Put16(&out, 0x21);
    Put32(&out, crc);
    Put32(&out, static_cast<uint32_t>(body.size()));
    Put32(&out, static_cast<uint32_t>(body.size()));
    Put16(&out, static_cast<uint32_t>(file.size()));
    Put16(&out, 0);
    out += file;
    out += body;
    // Its central directory entry.
    Put32(&directory, 0x02014b50);
    Put16(&directory, 20);
    Put16(&directory, 20);
    Put16(&directory, 0);
    Put16(&directory, 0);
    Put16(&directory, 0);
    Put16(&directory, 0x21);
    Put32(&directory, crc);
    Put32(&directory, static_cast<uint32_t>(body.size()));
    Put32(&directory, static_cast<uint32_t>(body.size()));
    Put16(&directory, static_cast<uint32_t>(file.size()));
    Put16(&directory, 0);
    Put16(&directory, 0);
    Put16(&directory, 0);
    Put16(&directory, 0);
    Put32(&directory, 0);
    Put32(&directory, offset);
    directory += file;
  }
  const uint32_t directory_at = static_cast<uint32_t>(out.size());
  out += directory;
  Put32(&out, 0x06054b50);
  Put16(&out, 0);
  Put16(&out, 0);
  Put16(&out, static_cast<uint32_t>(arrays.size()));
  Put16(&out, static_cast<uint32_t>(arrays.size()));
  Put32(&out, static_cast<uint32_t>(directory.size()));
  Put32(&out, directory_at);
  Put16(&out, 0);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
  f.close();
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, NpyArray>> ReadNpz(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a valid .npz: ", why));
  };
  // The end of central directory record: its signature, searched from the end (a zip
  // comment may follow it).
  if (s.size() < 22) return bad("too short");
  size_t end = std::string::npos;
  for (size_t at = s.size() - 22;; --at) {
    if (Get32(s, at) == 0x06054b50) {
      end = at;
      break;
    }
    if (at == 0 || s.size() - at > 22 + 65535) break;
  }
  if (end == std::string::npos) return bad("no zip directory");
  const uint32_t entries = Get16(s, end + 10);
  size_t at = Get32(s, end + 16);
  std::map<std::string, NpyArray> out;
  for (uint32_t e = 0; e < entries; ++e) {
    if (at + 46 > s.size() || Get32(s, at) != 0x02014b50) return bad("broken zip directory");
    const uint32_t method = Get16(s, at + 10);
    uint64_t size = Get32(s, at + 20);
    const uint32_t name_len = Get16(s, at + 28), extra_len = Get16(s, at + 30),
                   comment_len = Get16(s, at + 32);
    uint64_t local = Get32(s, at + 42);
    if (at + 46 + name_len + extra_len > s.size()) return bad("broken zip directory");
    const std::string name = s.substr(at + 46, name_len);
    // zip64: sizes and offset that did not fit 32 bits are in extra field 0x0001, in
    // this order, each only when its 32-bit field is 0xffffffff.
    for (size_t x = at + 46 + name_len; x + 4 <= at + 46 + name_len + extra_len;) {
      const uint32_t id = Get16(s, x), len = Get16(s, x + 2);
      if (id == 0x0001) {
        size_t v = x + 4;
        if (Get32(s, at + 24) == 0xffffffffu) v += 8;  // uncompressed size
        if (Get32(s, at + 20) == 0xffffffffu) {
          size = Get64(s, v);
          v += 8;
        }
        if (Get32(s, at + 42) == 0xffffffffu) local = Get64(s, v);
      }
      x += 4 + len;
    }
    at += 46 + name_len + extra_len + comment_len;
    if (method != 0) {
      return bad(absl::StrCat("'", name, "' is compressed (np.savez_compressed); save it "
                              "with np.savez"));
    }
    if (local + 30 > s.size() || Get32(s, local) != 0x04034b50) return bad("broken entry");
    const size_t data = local + 30 + Get16(s, local + 26) + Get16(s, local + 28);
    if (data + size > s.size()) return bad(absl::StrCat("'", name, "' is truncated"));
    absl::string_view key = name;
    if (!absl::ConsumeSuffix(&key, ".npy")) continue;
    absl::StatusOr<NpyArray> a = ParseNpy(name, s.substr(data, size));
    if (!a.ok()) return a.status();
    out[std::string(key)] = *std::move(a);
  }
  return out;
}

}  // namespace tessera::tools
