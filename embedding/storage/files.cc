#include "embedding/storage/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status.h"

namespace tessera::storage {
namespace {

namespace fs = std::filesystem;

absl::Status Errno(absl::string_view what, const std::string& path, int err) {
  const std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(message);
  if (err == ENOENT) return absl::NotFoundError(message);
  return absl::InternalError(message);
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return Errno("cannot open directory", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  return rc == 0 ? absl::OkStatus() : Errno("cannot sync directory", dir, err);
}

absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot write", path, errno);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", tmp, errno);
  absl::Status s = WriteAll(fd, contents, tmp);
  if (s.ok() && ::fsync(fd) != 0) s = Errno("cannot sync", tmp, errno);
  ::close(fd);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = Errno("cannot rename into", path, errno);
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  const std::string dir = fs::path(path).parent_path().string();
  return SyncDirectory(dir.empty() ? "." : dir);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path, errno);
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return Errno("cannot read", path, err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

absl::Status EnsureWritableDirectory(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("data directory ", dir, " cannot be created: ", ec.message()));
  }
  if (!fs::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("data directory ", dir, " is not a directory"));
  }
  const std::string probe = absl::StrCat(dir, "/.write-probe");
  absl::Status s = WriteFileAtomically(probe, "tessera");
  ::unlink(probe.c_str());
  if (!s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("data directory ", dir, " is not writable: ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status CopyTree(const std::string& from, const std::string& to) {
  std::error_code ec;
  if (fs::exists(to, ec)) return absl::AlreadyExistsError(absl::StrCat(to, " already exists"));
  fs::create_directories(to, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", to, ": ", ec.message()));
  for (const auto& entry : fs::recursive_directory_iterator(from, ec)) {
    const fs::path rel = fs::relative(entry.path(), from);
    const fs::path dst = fs::path(to) / rel;
    if (entry.is_directory()) {
      fs::create_directories(dst, ec);
    } else {
      bool linked = false;
      if (entry.path().extension() == ".sst") {
        fs::create_hard_link(entry.path(), dst, ec);
        linked = !ec;
        ec.clear();
      }
      if (!linked) fs::copy_file(entry.path(), dst, ec);
    }
    if (ec) {
      return absl::InternalError(absl::StrCat("cannot copy ", entry.path().string(), " to ",
                                              dst.string(), ": ", ec.message()));
    }
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", from, ": ", ec.message()));
  return SyncDirectory(to);
}

absl::Status RemoveTree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot remove ", path, ": ", ec.message()));
  return absl::OkStatus();
}

absl::Status CheckShardPlacement(const std::string& data_dir, int shard_index, int num_shards,
                                 uint64_t map_version) {
  const std::string path = data_dir + "/SHARD";
  const std::string place = absl::StrCat("shard ", shard_index, " of ", num_shards);
  absl::StatusOr<std::string> have = ReadFile(path);
  uint64_t held = 0;
  if (have.ok()) {
    // "shard i of n\n" and, since map versions are recorded, "map version v\n".
    const std::vector<std::string> lines = absl::StrSplit(*have, '\n', absl::SkipEmpty());
    const std::string was = lines.empty() ? "" : lines[0];
    if (was != place) {
      return absl::FailedPreconditionError(
          absl::StrCat("data directory ", data_dir, " belongs to ", was, ", not ", place,
                       "; start with the same --shard_index and --num_shards"));
    }
    constexpr absl::string_view kVersion = "map version ";
    if (lines.size() > 1 && absl::StartsWith(lines[1], kVersion) &&
        !absl::SimpleAtoi(absl::string_view(lines[1]).substr(kVersion.size()), &held)) {
      return absl::DataLossError(absl::StrCat(path, ": bad line '", lines[1], "'"));
    }
    if (held > map_version) {
      return absl::FailedPreconditionError(absl::StrCat(
          "data directory ", data_dir, " holds shard map version ", held,
          ", newer than --shard_map_version=", map_version, "; start with --shard_map_version=",
          held, " (or the coordinator's current version)"));
    }
    if (held == map_version) return absl::OkStatus();
  } else if (have.status().code() != absl::StatusCode::kNotFound) {
    return have.status();
  }
  TESSERA_RETURN_IF_ERROR(EnsureWritableDirectory(data_dir));
  return RecordShardPlacement(data_dir, shard_index, num_shards, map_version);
}

absl::Status RecordShardPlacement(const std::string& data_dir, int shard_index, int num_shards,
                                  uint64_t map_version) {
  return WriteFileAtomically(data_dir + "/SHARD",
                             absl::StrCat("shard ", shard_index, " of ", num_shards,
                                          "\nmap version ", map_version, "\n"));
}

int64_t TreeBytes(const std::string& path) {
  std::error_code ec;
  int64_t bytes = 0;
  for (const auto& entry : fs::recursive_directory_iterator(path, ec)) {
    if (entry.is_regular_file(ec)) bytes += static_cast<int64_t>(entry.file_size(ec));
  }
  return bytes;
}

}  // namespace tessera::storage
