// Replica::Save and Replica::LoadState: a replica's rows, cursors and dense network in one
// file of its --state_dir, so that a restarted replica reads on from where it was.
//
// The file: 8 bytes of magic, the length of a v1::ReplicaState (8 bytes, little-endian),
// the message, its CRC-32C; then, table by table in the message's order, its
// table_rows[i] records (ServingTable's layout) and their CRC-32C.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/crc32c.h"
#include "base/status.h"
#include "serving/internal/replica_shard.h"
#include "serving/replica.h"

namespace tessera::serving {

namespace {

constexpr char kMagic[8] = {'T', 'S', 'R', 'E', 'P', 'L', '1', '\n'};
constexpr char kFile[] = "replica.state";

// Writes to a file with a running CRC-32C; an error once stays.
class Writer {
 public:
  explicit Writer(const std::string& path)
      : path_(path), fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644)) {
    if (fd_ < 0) status_ = absl::InternalError(absl::StrCat("cannot write ", path));
  }
  ~Writer() {
    if (fd_ >= 0) ::close(fd_);
  }
  void Write(const void* data, size_t n) {
    crc_ = base::Crc32c(data, n, crc_);
    const char* p = static_cast<const char*>(data);
    while (status_.ok() && n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w <= 0) status_ = absl::InternalError(absl::StrCat("cannot write ", path_));
      p += w > 0 ? w : 0;
      n -= w > 0 ? static_cast<size_t>(w) : n;
    }
  }
  // Writes the CRC of what was written since the last one.
  void WriteCrc() {
    const uint32_t crc = crc_;
    Write(&crc, sizeof(crc));
    crc_ = 0;
  }
  absl::Status Finish() {
    if (status_.ok() && ::fsync(fd_) != 0) status_ = absl::InternalError("fsync failed");
    return status_;
  }

 private:
  const std::string path_;
  const int fd_;
  uint32_t crc_ = 0;
  absl::Status status_;
};

// Reads what Writer wrote, checking each CRC.
class Reader {
 public:
  explicit Reader(const std::string& path) : in_(path, std::ios::binary) {}
  bool Read(void* data, size_t n) {
    if (!in_.read(static_cast<char*>(data), static_cast<std::streamsize>(n))) return false;
    crc_ = base::Crc32c(data, n, crc_);
    return true;
  }
  bool CrcMatches() {
    const uint32_t want = crc_;
    uint32_t got = 0;
    if (!in_.read(reinterpret_cast<char*>(&got), sizeof(got))) return false;
    crc_ = 0;
    return got == want;
  }

 private:
  std::ifstream in_;
  uint32_t crc_ = 0;
};

absl::Status Corrupt(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what));
}

}  // namespace

absl::Status Replica::Save() {
  if (options_.state_dir.empty()) {
    return absl::FailedPreconditionError("this replica keeps no state (no state_dir)");
  }
  absl::MutexLock poll(&poll_mu_);
  v1::ReplicaState state;
  state.set_model(options_.model);
  state.set_format(embedding::ServingFormatName(options_.format));
  state.set_saved_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count());
  for (const auto& [address, shard] : shards_) {
    v1::ShardCursor* c = state.add_shards();
    c->set_address(address);
    *c->mutable_cursor() = shard->cursor;
    c->set_step(shard->step.load());
    c->set_head_step(shard->head_step.load());
  }
  std::vector<std::shared_ptr<embedding::ServingTable>> tables;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, table] : tables_) tables.push_back(table);
    if (dense_ != nullptr) *state.mutable_dense() = dense_->snapshot();
  }
  for (const auto& table : tables) {
    *state.add_tables() = table->config();
    state.add_table_rows(table->rows());
  }
  std::filesystem::create_directories(options_.state_dir);
  const std::string path = absl::StrCat(options_.state_dir, "/", kFile);
  Writer out(path + ".tmp");
  const std::string header = state.SerializeAsString();
  const uint64_t length = header.size();
  out.Write(kMagic, sizeof(kMagic));
  out.Write(&length, sizeof(length));
  out.Write(header.data(), header.size());
  out.WriteCrc();
  for (size_t i = 0; i < tables.size(); ++i) {
    // Rows sent since the header counted them are not written: the next Save has them.
    int64_t left = state.table_rows(i);
    TESSERA_RETURN_IF_ERROR(tables[i]->ForEachRecords([&](const uint8_t* r, int64_t n) {
      n = std::min(n, left);
      out.Write(r, n * tables[i]->record_bytes());
      left -= n;
      return absl::OkStatus();
    }));
    out.WriteCrc();
  }
  TESSERA_RETURN_IF_ERROR(out.Finish());
  std::error_code error;
  std::filesystem::rename(path + ".tmp", path, error);
  if (error) return absl::InternalError(absl::StrCat("cannot rename ", path, ".tmp"));
  return absl::OkStatus();
}

void Replica::LoadState() {
  if (options_.state_dir.empty()) return;
  const std::string path = absl::StrCat(options_.state_dir, "/", kFile);
  if (!std::filesystem::exists(path)) return;
  const absl::Status loaded = ReadState(path);
  if (loaded.ok()) return;
  // A fresh start: what was taken goes.
  {
    absl::MutexLock lock(&mu_);
    tables_.clear();
    dense_ = nullptr;
  }
  shards_.clear();
  Note(absl::StrCat("the state in ", path, " not taken (", loaded.message(),
                    "): every shard is read whole"));
}

absl::Status Replica::ReadState(const std::string& path) {
  Reader in(path);
  char magic[sizeof(kMagic)];
  uint64_t length = 0;
  if (!in.Read(magic, sizeof(magic)) || std::memcmp(magic, kMagic, sizeof(kMagic)) != 0 ||
      !in.Read(&length, sizeof(length)) || length > (uint64_t{1} << 30)) {
    return Corrupt(path, "not a replica's state");
  }
  std::string header(length, '\0');
  v1::ReplicaState state;
  if (!in.Read(header.data(), length) || !in.CrcMatches() || !state.ParseFromString(header) ||
      state.table_rows_size() != state.tables_size()) {
    return Corrupt(path, "its header is damaged");
  }
  if (state.model() != options_.model ||
      state.format() != embedding::ServingFormatName(options_.format)) {
    return absl::FailedPreconditionError(
        absl::StrCat("it holds model '", state.model(), "' in ", state.format()));
  }
  for (int i = 0; i < state.tables_size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<embedding::ServingTable> table,
                             embedding::ServingTable::Create(state.tables(i), options_.format));
    std::vector<uint8_t> records(state.table_rows(i) * table->record_bytes());
    if (!in.Read(records.data(), records.size()) || !in.CrcMatches()) {
      return Corrupt(path,
                     absl::StrCat("the rows of table '", state.tables(i).name(), "' are damaged"));
    }
    if (!Wanted(state.tables(i).name())) continue;
    TESSERA_RETURN_IF_ERROR(table->LoadRecords(records.data(), state.table_rows(i)));
    absl::MutexLock lock(&mu_);
    tables_[state.tables(i).name()] = std::move(table);
  }
  if (state.has_dense()) {
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<const DenseModel> dense,
                             DenseModel::Make(state.dense()));
    absl::MutexLock lock(&mu_);
    dense_ = std::move(dense);
  }
  for (const v1::ShardCursor& c : state.shards()) {
    auto shard = std::make_unique<Shard>(-1, c.address(), options_.client);
    shard->cursor = c.cursor();
    shard->step = c.step();
    shard->head_step = c.head_step();
    absl::MutexLock lock(&mu_);
    shards_[c.address()] = std::move(shard);
  }
  const auto age = std::chrono::system_clock::now().time_since_epoch() -
                   std::chrono::milliseconds(state.saved_unix_ms());
  Note(absl::StrCat("resumed from the state saved ",
                    std::chrono::duration_cast<std::chrono::seconds>(age).count(),
                    " s ago: its rows, dense weights of step ",
                    state.has_dense() ? state.dense().step() : -1,
                    " and each shard's cursor (read on from there)"));
  return absl::OkStatus();
}

}  // namespace tessera::serving
