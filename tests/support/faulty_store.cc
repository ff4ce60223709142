#include "tests/support/faulty_store.h"

namespace tessera::testing {
namespace {

absl::Status Full() { return absl::ResourceExhaustedError("No space left on device"); }

// True when this write is to fail (and counts it against writes_left).
bool WriteFails(const StoreFaults& faults) {
  if (faults.writes.load()) return true;
  int left = faults.writes_left.load();
  while (left > 0 && !faults.writes_left.compare_exchange_weak(left, left - 1)) {
  }
  return left == 0;
}

}  // namespace

absl::Status FaultyStore::Write(absl::Span<const storage::KvWrite> writes, bool sync) {
  return WriteFails(*faults_) ? Full() : inner_->Write(writes, sync);
}

absl::Status FaultyStore::WriteUnlogged(absl::Span<const storage::KvWrite> writes) {
  return WriteFails(*faults_) ? Full() : inner_->WriteUnlogged(writes);
}

absl::Status FaultyStore::Checkpoint(const std::string& dir) {
  if (faults_->writes.load() || faults_->checkpoints.load()) return Full();
  return inner_->Checkpoint(dir);
}

storage::KvStoreFactory FaultyRocksDbStores(const StoreFaults* faults) {
  return [faults](const std::string& path, const storage::KvStoreOptions& options)
             -> absl::StatusOr<std::unique_ptr<storage::KvStore>> {
    absl::StatusOr<std::unique_ptr<storage::KvStore>> inner =
        storage::OpenRocksDbStore(path, options);
    if (!inner.ok()) return inner.status();
    return std::unique_ptr<storage::KvStore>(new FaultyStore(*std::move(inner), faults));
  };
}

}  // namespace tessera::testing
