#include <memory>

#include "absl/strings/str_cat.h"
#include "embedding/storage/kv_store.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/utilities/checkpoint.h"
#include "rocksdb/write_batch.h"

namespace tessera::storage {
namespace {

absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": ", s.ToString());
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(message);
  if (s.IsCorruption()) return absl::DataLossError(message);
  if (s.IsNotFound()) return absl::NotFoundError(message);
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(message);
  return absl::InternalError(message);
}

class RocksDbStore final : public KvStore {
 public:
  RocksDbStore(std::unique_ptr<rocksdb::DB> db, std::string path)
      : db_(std::move(db)), path_(std::move(path)) {
    read_.verify_checksums = true;
  }

  absl::Status Write(absl::Span<const KvWrite> writes, bool sync) override {
    rocksdb::WriteOptions o;
    o.sync = sync;
    return Apply(writes, o);
  }

  absl::Status WriteUnlogged(absl::Span<const KvWrite> writes) override {
    rocksdb::WriteOptions o;
    o.disableWAL = true;
    return Apply(writes, o);
  }

  absl::StatusOr<std::optional<std::string>> Get(absl::string_view key) const override {
    std::string value;
    rocksdb::Status s = db_->Get(read_, rocksdb::Slice(key.data(), key.size()), &value);
    if (s.IsNotFound()) return std::optional<std::string>();
    if (!s.ok()) return FromRocks(s, absl::StrCat("store ", path_, ": read"));
    return std::optional<std::string>(std::move(value));
  }

  absl::Status Scan(
      absl::string_view prefix,
      const std::function<absl::Status(absl::string_view, absl::string_view)>& fn) const override {
    // A scan reads each block once: read ahead, and keep it out of the block cache.
    rocksdb::ReadOptions scan = read_;
    scan.fill_cache = false;
    scan.readahead_size = size_t{4} << 20;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(scan));
    const rocksdb::Slice p(prefix.data(), prefix.size());
    for (it->Seek(p); it->Valid() && it->key().starts_with(p); it->Next()) {
      absl::Status s = fn(absl::string_view(it->key().data(), it->key().size()),
                          absl::string_view(it->value().data(), it->value().size()));
      if (!s.ok()) return s;
    }
    return FromRocks(it->status(), absl::StrCat("store ", path_, ": scan"));
  }

  absl::Status Checkpoint(const std::string& dir) override {
    rocksdb::Checkpoint* raw = nullptr;
    rocksdb::Status s = rocksdb::Checkpoint::Create(db_.get(), &raw);
    if (!s.ok()) return FromRocks(s, absl::StrCat("store ", path_, ": checkpoint"));
    std::unique_ptr<rocksdb::Checkpoint> cp(raw);
    // log_size_for_flush = 0: flush the memtable, so the copy needs no WAL replay.
    return FromRocks(cp->CreateCheckpoint(dir, /*log_size_for_flush=*/0),
                     absl::StrCat("store ", path_, ": checkpoint into ", dir));
  }

  int64_t ApproximateBytesOf(absl::string_view prefix) const override {
    // [prefix, prefix with its last byte incremented): every key that starts with it.
    std::string end(prefix);
    while (!end.empty() && static_cast<unsigned char>(end.back()) == 0xff) end.pop_back();
    if (end.empty()) return ApproximateBytes();
    end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
    const rocksdb::Range range(rocksdb::Slice(prefix.data(), prefix.size()), end);
    uint64_t bytes = 0;
    rocksdb::SizeApproximationOptions options;
    options.include_memtables = true;
    options.include_files = true;
    if (!db_->GetApproximateSizes(options, db_->DefaultColumnFamily(), &range, 1, &bytes).ok()) {
      return 0;
    }
    return static_cast<int64_t>(bytes);
  }

  int64_t ApproximateBytes() const override {
    uint64_t sst = 0, wal = 0;
    db_->GetIntProperty(rocksdb::DB::Properties::kTotalSstFilesSize, &sst);
    db_->GetIntProperty(rocksdb::DB::Properties::kCurSizeAllMemTables, &wal);
    return static_cast<int64_t>(sst + wal);
  }

 private:
  absl::Status Apply(absl::Span<const KvWrite> writes, const rocksdb::WriteOptions& o) {
    rocksdb::WriteBatch batch;
    for (const KvWrite& w : writes) {
      rocksdb::Status s = w.erase ? batch.Delete(w.key) : batch.Put(w.key, w.value);
      if (!s.ok()) return FromRocks(s, absl::StrCat("store ", path_, ": batch"));
    }
    return FromRocks(db_->Write(o, &batch), absl::StrCat("store ", path_, ": write"));
  }

  std::unique_ptr<rocksdb::DB> db_;
  const std::string path_;
  rocksdb::ReadOptions read_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvStore>> OpenRocksDbStore(const std::string& path,
                                                          const KvStoreOptions& options) {
  rocksdb::Options o;
  o.create_if_missing = options.create_if_missing;
  o.paranoid_checks = true;
  o.IncreaseParallelism(2);
  o.OptimizeLevelStyleCompaction();
  // Rows are float vectors, which barely compress; storing them plain saves the CPU.
  o.compression = rocksdb::kNoCompression;
  for (auto& c : o.compression_per_level) c = rocksdb::kNoCompression;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = options.read_only ? rocksdb::DB::OpenForReadOnly(o, path, &raw)
                                        : rocksdb::DB::Open(o, path, &raw);
  if (!s.ok()) {
    absl::Status st = FromRocks(s, absl::StrCat("cannot open store ", path));
    // Opening fails on what the operator has to fix (permissions, a full or read-only
    // disk, a missing store): say so with one code.
    if (st.code() == absl::StatusCode::kInternal ||
        st.code() == absl::StatusCode::kInvalidArgument) {
      return absl::FailedPreconditionError(st.message());
    }
    return st;
  }
  return std::unique_ptr<KvStore>(new RocksDbStore(std::unique_ptr<rocksdb::DB>(raw), path));
}

}  // namespace tessera::storage
