#include "embedding/storage/checkpoint_manifest.h"

#include <algorithm>
#include <filesystem>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/crc32c.h"
#include "embedding/collection.h"
#include "embedding/storage/files.h"

namespace tessera::storage {
namespace {

constexpr absl::string_view kHeader = "tessera-checkpoint 1\n";

}  // namespace

std::string EncodeManifest(const CheckpointManifest& m) {
  std::string out(kHeader);
  if (!m.model.empty()) absl::StrAppend(&out, "model=", m.model, "\n");
  if (m.sequence != 0) absl::StrAppend(&out, "sequence=", m.sequence, "\n");
  absl::StrAppend(&out, "step=", m.step, "\n", "created_unix_ms=", m.created_unix_ms, "\n",
                  "rows=", m.rows, "\n", "bytes=", m.bytes, "\n");
  for (const auto& t : m.tables) absl::StrAppend(&out, "table=", t, "\n");
  for (const auto& a : m.attachments) absl::StrAppend(&out, "attachment=", a, "\n");
  for (const auto& s : m.shards) absl::StrAppend(&out, "shard=", s, "\n");
  for (const auto& d : m.shard_dirs) absl::StrAppend(&out, "shard_dir=", d, "\n");
  absl::StrAppend(&out, "crc32c=", absl::StrFormat("%08x", base::Crc32c(out.data(), out.size())),
                  "\n");
  return out;
}

absl::StatusOr<CheckpointManifest> DecodeManifest(absl::string_view text, const std::string& path) {
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest ", path, " is invalid: ", why));
  };
  if (!absl::StartsWith(text, kHeader)) return bad("missing header");
  const size_t crc_at = text.rfind("crc32c=");
  if (crc_at == absl::string_view::npos) return bad("no checksum line (torn write?)");
  absl::string_view crc_text = text.substr(crc_at + 7);
  if (!absl::ConsumeSuffix(&crc_text, "\n")) return bad("checksum line is incomplete");
  uint32_t crc = 0;
  if (!absl::SimpleHexAtoi(crc_text, &crc) || crc != base::Crc32c(text.data(), crc_at)) {
    return bad("checksum mismatch");
  }
  CheckpointManifest m;
  bool has_step = false;
  for (absl::string_view line : absl::StrSplit(text.substr(kHeader.size(), crc_at - kHeader.size()),
                                               '\n', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits('=', 1));
    if (kv.first == "step") {
      has_step = absl::SimpleAtoi(kv.second, &m.step);
    } else if (kv.first == "model") {
      m.model = std::string(kv.second);
    } else if (kv.first == "sequence") {
      if (!absl::SimpleAtoi(kv.second, &m.sequence)) return bad("bad sequence");
    } else if (kv.first == "created_unix_ms") {
      if (!absl::SimpleAtoi(kv.second, &m.created_unix_ms)) return bad("bad created_unix_ms");
    } else if (kv.first == "rows") {
      if (!absl::SimpleAtoi(kv.second, &m.rows)) return bad("bad rows");
    } else if (kv.first == "bytes") {
      if (!absl::SimpleAtoi(kv.second, &m.bytes)) return bad("bad bytes");
    } else if (kv.first == "table") {
      m.tables.emplace_back(kv.second);
    } else if (kv.first == "attachment") {
      m.attachments.emplace_back(kv.second);
    } else if (kv.first == "shard") {
      m.shards.emplace_back(kv.second);
    } else if (kv.first == "shard_dir") {
      m.shard_dirs.emplace_back(kv.second);
    }
  }
  if (!has_step) return bad("no step");
  return m;
}

absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  return DecodeManifest(*text, path);
}

absl::Status ValidateAttachmentName(absl::string_view name) {
  if (name.empty() || name.size() > 128 || name[0] == '.') {
    return absl::InvalidArgumentError(absl::StrCat("bad attachment name '", name, "'"));
  }
  for (const char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad attachment name '", name, "': use letters, digits, '.', '_', '-'"));
    }
  }
  return absl::OkStatus();
}

std::string CheckpointDirName(const std::string& model, int64_t step) {
  return model.empty() ? absl::StrCat(step) : absl::StrCat(model, ".", step);
}

std::vector<std::pair<std::string, CheckpointManifest>> ListCompleteCheckpoints(
    const std::string& root, const std::function<void(const std::string&)>& log) {
  namespace fs = std::filesystem;
  struct Dir {
    std::string model;
    int64_t step;
    std::string path;
  };
  std::vector<Dir> dirs;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (!entry.is_directory(ec)) continue;
    const std::string name = entry.path().filename().string();
    const size_t dot = name.rfind('.');
    Dir d{dot == std::string::npos ? "" : name.substr(0, dot), 0, entry.path().string()};
    if (absl::SimpleAtoi(dot == std::string::npos ? name : name.substr(dot + 1), &d.step) &&
        d.step >= 0 && (dot == std::string::npos || dot > 0)) {
      dirs.push_back(std::move(d));
    }
  }
  std::vector<std::pair<std::string, CheckpointManifest>> out;
  for (const Dir& d : dirs) {
    absl::StatusOr<CheckpointManifest> m = ReadManifest(absl::StrCat(d.path, "/MANIFEST"));
    if (!m.ok()) {
      log(absl::StrCat("tessera: warning: skipping checkpoint ", d.path, ": ",
                       m.status().code() == absl::StatusCode::kNotFound
                           ? "no manifest (incomplete)"
                           : std::string(m.status().message())));
      continue;
    }
    if (m->step != d.step || m->model != d.model) {
      log(absl::StrCat("tessera: warning: skipping checkpoint ", d.path, ": its manifest is for ",
                       m->model.empty() ? "" : absl::StrCat("model '", m->model, "' "), "step ",
                       m->step));
      continue;
    }
    out.emplace_back(d.path, *std::move(m));
  }
  // Creation order, not step order: a checkpoint of step 5 taken after one of step 2400 is
  // the newer one.
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return std::tie(a.second.sequence, a.second.created_unix_ms, a.first) <
           std::tie(b.second.sequence, b.second.created_unix_ms, b.first);
  });
  return out;
}

absl::StatusOr<const std::pair<std::string, CheckpointManifest>*> ChooseCheckpoint(
    const std::vector<std::pair<std::string, CheckpointManifest>>& complete, int64_t step,
    const std::string& root, const std::string& model) {
  const std::pair<std::string, CheckpointManifest>* chosen = nullptr;
  for (const auto& c : complete) {
    if (c.second.model == model && (step < 0 || c.second.step == step)) chosen = &c;
  }
  if (chosen != nullptr) return chosen;
  const std::string of = model.empty() ? "" : absl::StrCat(" of model '", model, "'");
  if (step < 0)
    return absl::NotFoundError(absl::StrCat("no complete checkpoint", of, " in ", root));
  // The steps there are, so that the caller can pick one.
  std::vector<int64_t> steps;
  for (const auto& c : complete) {
    if (c.second.model == model) steps.push_back(c.second.step);
  }
  std::sort(steps.begin(), steps.end());
  return absl::NotFoundError(absl::StrCat(
      "no complete checkpoint", of, " of step ", step, " in ", root,
      steps.empty() ? std::string("; there is none")
                    : absl::StrCat("; its complete checkpoints are of steps ",
                                   absl::StrJoin(steps, ", "))));
}

absl::Status RefuseOverwrite(
    const std::vector<std::pair<std::string, CheckpointManifest>>& complete,
    const std::string& model, int64_t step) {
  for (const auto& c : complete) {
    if (c.second.model == model && c.second.step == step) {
      return absl::AlreadyExistsError(absl::StrCat(
          embedding::CheckpointName(model, step), " exists already (", c.first,
          "); checkpoints are never overwritten: pick another step"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> RetiredCheckpoints(
    const std::vector<std::pair<std::string, CheckpointManifest>>& complete, int keep) {
  std::vector<std::string> retired;
  if (keep <= 0) return retired;
  std::map<std::string, int> kept;  // by model, counted from the newest
  for (auto it = complete.rbegin(); it != complete.rend(); ++it) {
    if (++kept[it->second.model] > keep) retired.push_back(it->first);
  }
  return retired;
}

int64_t NextCheckpointSequence(
    const std::vector<std::pair<std::string, CheckpointManifest>>& complete) {
  int64_t next = 1;
  for (const auto& c : complete) next = std::max(next, c.second.sequence + 1);
  return next;
}

absl::Status ReadAttachments(const std::string& dir, const CheckpointManifest& m,
                             std::map<std::string, std::string>* out) {
  out->clear();
  for (const auto& name : m.attachments) {
    absl::StatusOr<std::string> blob = ReadFile(absl::StrCat(dir, "/attachments/", name));
    if (!blob.ok()) return blob.status();
    (*out)[name] = *std::move(blob);
  }
  return absl::OkStatus();
}

}  // namespace tessera::storage
