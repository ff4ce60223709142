#ifndef TESSERA_TESTS_SUPPORT_FAULTY_STORE_H_
#define TESSERA_TESTS_SUPPORT_FAULTY_STORE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "embedding/storage/kv_store.h"

namespace tessera::testing {

// What a FaultyStore makes fail, switched on and off by the test while it runs.
struct StoreFaults {
  std::atomic<bool> writes{false};       // every write and checkpoint, as on a full disk
  std::atomic<bool> checkpoints{false};  // only the store's checkpoints
  // >= 0: that many more writes pass, then every write fails as with `writes` (a disk that
  // fills in the middle of something); -1: off.
  mutable std::atomic<int> writes_left{-1};
};

// A KvStore over another (RocksDB in the tests) whose writes fail with RESOURCE_EXHAUSTED
// "No space left on device" while `faults` says so; reads always pass through.
class FaultyStore final : public storage::KvStore {
 public:
  FaultyStore(std::unique_ptr<storage::KvStore> inner, const StoreFaults* faults)
      : inner_(std::move(inner)), faults_(faults) {}

  absl::Status Write(absl::Span<const storage::KvWrite> writes, bool sync) override;
  absl::Status WriteUnlogged(absl::Span<const storage::KvWrite> writes) override;
  absl::StatusOr<std::optional<std::string>> Get(absl::string_view key) const override {
    return inner_->Get(key);
  }
  absl::Status Scan(
      absl::string_view prefix,
      const std::function<absl::Status(absl::string_view, absl::string_view)>& fn) const override {
    return inner_->Scan(prefix, fn);
  }
  absl::Status Checkpoint(const std::string& dir) override;
  int64_t ApproximateBytes() const override { return inner_->ApproximateBytes(); }
  int64_t ApproximateBytesOf(absl::string_view prefix) const override {
    return inner_->ApproximateBytesOf(prefix);
  }

 private:
  std::unique_ptr<storage::KvStore> inner_;
  const StoreFaults* faults_;
};

// A DurableOptions::open_store that opens RocksDB stores wrapped in FaultyStores;
// `faults` must outlive every store it opens.
storage::KvStoreFactory FaultyRocksDbStores(const StoreFaults* faults);

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_SUPPORT_FAULTY_STORE_H_
