#include "embedding/storage/coordinator_store.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "base/crc32c.h"
#include "base/status.h"
#include "embedding/storage/files.h"

namespace tessera::storage {
namespace {

constexpr absl::string_view kStateMagic = "tessera-coordinator-state 1\n";

std::string EncodeState(const v1::CoordinatorState& state) {
  std::string out(kStateMagic);
  state.AppendToString(&out);
  const uint32_t crc = base::Crc32c(out.data(), out.size());
  out.append(reinterpret_cast<const char*>(&crc), 4);
  return out;
}

absl::StatusOr<v1::CoordinatorState> DecodeState(absl::string_view data, const std::string& path) {
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("coordinator state ", path, " is corrupt: ", why));
  };
  if (data.size() < kStateMagic.size() + 4 || data.substr(0, kStateMagic.size()) != kStateMagic) {
    return bad("bad header");
  }
  uint32_t crc = 0;
  std::memcpy(&crc, data.data() + data.size() - 4, 4);
  if (crc != base::Crc32c(data.data(), data.size() - 4)) return bad("checksum mismatch");
  v1::CoordinatorState state;
  const absl::string_view body =
      data.substr(kStateMagic.size(), data.size() - 4 - kStateMagic.size());
  if (!state.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return bad("does not parse");
  }
  return state;
}

}  // namespace

CoordinatorStore::CoordinatorStore(std::string dir, int keep,
                                   std::function<void(const std::string&)> log)
    : dir_(std::move(dir)), keep_(keep), log_(std::move(log)) {}

void CoordinatorStore::Log(const std::string& line) const {
  if (log_) {
    log_(line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

absl::StatusOr<std::unique_ptr<CoordinatorStore>> CoordinatorStore::Open(
    const std::string& dir, int keep_checkpoints, std::function<void(const std::string&)> log) {
  if (keep_checkpoints < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep_checkpoints must be >= 0, got ", keep_checkpoints));
  }
  TESSERA_RETURN_IF_ERROR(EnsureWritableDirectory(dir));
  std::unique_ptr<CoordinatorStore> s(new CoordinatorStore(dir, keep_checkpoints, std::move(log)));
  const std::string path = dir + "/state";
  absl::StatusOr<std::string> data = ReadFile(path);
  if (data.ok()) {
    TESSERA_ASSIGN_OR_RETURN(v1::CoordinatorState state, DecodeState(*data, path));
    absl::MutexLock lock(&s->mu_);
    s->state_ = std::move(state);
  } else if (data.status().code() != absl::StatusCode::kNotFound) {
    return data.status();
  }
  return s;
}

v1::CoordinatorState CoordinatorStore::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

absl::Status CoordinatorStore::Save(const v1::CoordinatorState& state) {
  absl::MutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(WriteFileAtomically(dir_ + "/state", EncodeState(state)));
  state_ = state;
  return absl::OkStatus();
}

std::vector<std::pair<std::string, CheckpointManifest>> CoordinatorStore::Complete() const {
  return ListCompleteCheckpoints(dir_ + "/checkpoints",
                                 [this](const std::string& line) { Log(line); });
}

absl::StatusOr<CheckpointManifest> CoordinatorStore::CommitCheckpoint(
    CheckpointManifest manifest, const embedding::Attachments& attachments) {
  for (const auto& [name, blob] : attachments)
    TESSERA_RETURN_IF_ERROR(ValidateAttachmentName(name));
  absl::MutexLock lock(&mu_);
  const auto before = Complete();
  TESSERA_RETURN_IF_ERROR(RefuseOverwrite(before, manifest.model, manifest.step));
  manifest.sequence = NextCheckpointSequence(before);
  const std::string dir =
      absl::StrCat(dir_, "/checkpoints/", CheckpointDirName(manifest.model, manifest.step));
  TESSERA_RETURN_IF_ERROR(RemoveTree(dir));
  std::error_code ec;
  std::filesystem::create_directories(dir + "/attachments", ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  manifest.attachments.clear();
  for (const auto& [name, blob] : attachments) {
    TESSERA_RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(dir, "/attachments/", name), blob));
    manifest.attachments.push_back(name);
    manifest.bytes += static_cast<int64_t>(blob.size());
  }
  manifest.created_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
  TESSERA_RETURN_IF_ERROR(WriteFileAtomically(dir + "/MANIFEST", EncodeManifest(manifest)));
  for (const std::string& retired : RetiredCheckpoints(Complete(), keep_)) {
    absl::Status s = RemoveTree(retired);
    if (!s.ok()) Log(absl::StrCat("tessera: warning: ", s.message()));
  }
  return manifest;
}

absl::StatusOr<CheckpointManifest> CoordinatorStore::FindCheckpoint(
    int64_t step, embedding::Attachments* attachments, const std::string& model) const {
  absl::MutexLock lock(&mu_);
  const auto complete = Complete();
  TESSERA_ASSIGN_OR_RETURN(const auto* chosen,
                           ChooseCheckpoint(complete, step, dir_ + "/checkpoints", model));
  if (attachments != nullptr) {
    TESSERA_RETURN_IF_ERROR(ReadAttachments(chosen->first, chosen->second, attachments));
  }
  return chosen->second;
}

std::vector<CheckpointManifest> CoordinatorStore::ListCheckpoints() const {
  absl::MutexLock lock(&mu_);
  std::vector<CheckpointManifest> out;
  for (auto& [dir, m] : Complete()) out.push_back(m);
  return out;
}

}  // namespace tessera::storage
