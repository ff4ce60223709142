#ifndef TESSERA_CLIENT_OBJECT_POOL_H_
#define TESSERA_CLIENT_OBJECT_POOL_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace tessera::client {

// Idle objects kept between calls, so that per-call buffers (protobuf messages, index
// vectors) keep their capacity instead of being allocated, page-faulted and grown afresh
// for every large batch. At most `max_idle` objects are kept; more concurrent callers get
// fresh ones. Thread-safe.
template <typename T>
class ObjectPool {
 public:
  // The object, returned to the pool when the lease ends.
  class Lease {
   public:
    Lease(ObjectPool* pool, std::unique_ptr<T> object) : pool_(pool), object_(std::move(object)) {}
    Lease(Lease&&) = default;
    ~Lease() {
      if (object_ != nullptr) pool_->Release(std::move(object_));
    }
    T* operator->() const { return object_.get(); }
    T& operator*() const { return *object_; }
    T* get() const { return object_.get(); }

   private:
    ObjectPool* pool_;
    std::unique_ptr<T> object_;
  };

  explicit ObjectPool(std::function<std::unique_ptr<T>()> make, size_t max_idle = 8)
      : make_(std::move(make)), max_idle_(max_idle) {}

  Lease Acquire() {
    {
      absl::MutexLock lock(&mu_);
      if (!idle_.empty()) {
        std::unique_ptr<T> object = std::move(idle_.back());
        idle_.pop_back();
        return Lease(this, std::move(object));
      }
    }
    return Lease(this, make_());
  }

 private:
  void Release(std::unique_ptr<T> object) {
    absl::MutexLock lock(&mu_);
    if (idle_.size() < max_idle_) idle_.push_back(std::move(object));
  }

  const std::function<std::unique_ptr<T>()> make_;
  const size_t max_idle_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<T>> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::client

#endif  // TESSERA_CLIENT_OBJECT_POOL_H_
