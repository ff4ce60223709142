#ifndef TESSERA_EMBEDDING_INTERNAL_READER_EPOCHS_H_
#define TESSERA_EMBEDDING_INTERNAL_READER_EPOCHS_H_

#include <atomic>
#include <cstdint>

namespace tessera::embedding_internal {

// The table's lock-free readers, counted by epoch, so that maps a writer replaced are
// freed while readers keep coming (a single count of readers in flight may never be zero
// under steady lookups, and replaced maps would pile up). A reader counts itself in its
// epoch's counter (two counters, by parity) for as long as it may hold a map. Maps are
// tagged with the epoch in which they were replaced; once no reader of epoch e - 1 is left
// (nor, as epochs advance only then, of any earlier one) while e is current, maps tagged
// before e are freed and epoch e + 1 opens.
class ReaderEpochs {
 public:
  // Counts a reader in; returns what to pass to Leave.
  int Enter() {
    for (;;) {
      const uint64_t e = epoch_.load(std::memory_order_seq_cst);
      readers_[e & 1].fetch_add(1, std::memory_order_seq_cst);
      // Still the current epoch: a writer that looks at this counter now sees this reader.
      if (epoch_.load(std::memory_order_seq_cst) == e) return static_cast<int>(e & 1);
      readers_[e & 1].fetch_sub(1, std::memory_order_release);
    }
  }
  void Leave(int slot) { readers_[slot].fetch_sub(1, std::memory_order_release); }
  // The epoch a map replaced now is tagged with (read after the replacement is published).
  uint64_t current() const { return epoch_.load(std::memory_order_seq_cst); }
  // For writers: the oldest epoch a reader may still be in. Maps tagged before it can be
  // freed. Opens the next epoch when the one before the current has no reader left.
  uint64_t Oldest() {
    uint64_t e = epoch_.load(std::memory_order_seq_cst);
    if (readers_[(e - 1) & 1].load(std::memory_order_seq_cst) != 0) return e - 1;
    epoch_.compare_exchange_strong(e, e + 1, std::memory_order_seq_cst);
    return e;
  }
  // Readers in flight (for tests).
  int32_t readers() const {
    return readers_[0].load(std::memory_order_relaxed) +
           readers_[1].load(std::memory_order_relaxed);
  }

 private:
  std::atomic<uint64_t> epoch_{2};  // from 2, so that e - 1 and e - 2 are epochs too
  std::atomic<int32_t> readers_[2] = {0, 0};
};

}  // namespace tessera::embedding_internal

#endif  // TESSERA_EMBEDDING_INTERNAL_READER_EPOCHS_H_
