#ifndef TESSERA_EMBEDDING_MEMORY_BUDGET_H_
#define TESSERA_EMBEDDING_MEMORY_BUDGET_H_

// The bytes of memory a collection's rows may take, shared by all its tables and shards:
// past it a new row is refused (RESOURCE_EXHAUSTED naming the table and the budget) or,
// for a table with eviction, makes room by evicting one, so that the process is never
// killed for memory by its own rows. A row counts its stored size (weights, optimizer
// state, meta, padding) and its share of the id map.

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace tessera::embedding {

class MemoryBudget {
 public:
  explicit MemoryBudget(int64_t limit_bytes) : limit_(limit_bytes) {}

  int64_t limit() const { return limit_; }
  int64_t used() const { return used_.load(std::memory_order_relaxed); }
  // Whether `bytes` more fit now (a hint: others may take them meanwhile).
  bool HasRoomFor(int64_t bytes) const { return used() + bytes <= limit_; }
  // Takes `bytes` when they fit; false, taking nothing, when they do not.
  bool TryTake(int64_t bytes);
  // Counts `bytes` (negative: gives them back) without a check: rows already made.
  void Add(int64_t bytes) { used_.fetch_add(bytes, std::memory_order_relaxed); }

 private:
  const int64_t limit_;
  std::atomic<int64_t> used_{0};
};

// The default budget for rows in this process: the memory it may use (the tightest limit
// of its memory cgroup and the cgroups above it, cgroup v2 or v1, else 90% of physical
// memory) minus what it needs besides its rows to serve (an eighth of that, at least
// 128 MiB). `cgroup_root` is where cgroups are mounted and `self_cgroup` the file naming
// this process's cgroups (tests pass their own).
int64_t DefaultMemoryBudget(const std::string& cgroup_root = "/sys/fs/cgroup",
                            const std::string& self_cgroup = "/proc/self/cgroup");

// ResourceExhausted: table `table`'s `rows` new rows of `row_bytes` each do not fit in
// `budget`; says what to do.
absl::Status MemoryBudgetFull(const std::string& table, const MemoryBudget& budget, int64_t rows,
                              int64_t row_bytes);

// "512.0 MiB" (or "40000 bytes" below a mebibyte): how messages show a byte count.
std::string Mebibytes(int64_t bytes);

}  // namespace tessera::embedding

#endif  // TESSERA_EMBEDDING_MEMORY_BUDGET_H_
