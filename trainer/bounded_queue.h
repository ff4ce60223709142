#ifndef TESSERA_TRAINER_BOUNDED_QUEUE_H_
#define TESSERA_TRAINER_BOUNDED_QUEUE_H_

#include <deque>
#include <optional>
#include <utility>

#include "absl/synchronization/mutex.h"

namespace tessera::trainer {

// A blocking FIFO of at most `capacity` items between producer and consumer threads.
// Close() wakes everyone: Push then fails and Pop drains what is left, then returns
// nullopt. Thread-safe.
template <typename T>
class BoundedQueue {
 public:
  explicit BoundedQueue(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  // Blocks while full. False when the queue was closed (the item is dropped).
  bool Push(T item) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &BoundedQueue::CanPush));
    if (closed_) return false;
    items_.push_back(std::move(item));
    return true;
  }

  // Blocks while empty and open. nullopt once closed and drained.
  std::optional<T> Pop() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &BoundedQueue::CanPop));
    if (items_.empty()) return std::nullopt;
    T item = std::move(items_.front());
    items_.pop_front();
    return item;
  }

  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

  size_t size() const {
    absl::MutexLock lock(&mu_);
    return items_.size();
  }

 private:
  bool CanPush() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || items_.size() < capacity_;
  }
  bool CanPop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || !items_.empty(); }

  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::deque<T> items_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tessera::trainer

#endif  // TESSERA_TRAINER_BOUNDED_QUEUE_H_
