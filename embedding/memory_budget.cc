#include "embedding/memory_budget.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace tessera::embedding {
namespace {

// A cgroup limit file's value; 0 when absent, "max" or absurdly large (no limit).
int64_t ReadLimit(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!in || !std::getline(in, text)) return 0;
  int64_t v = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &v)) return 0;  // "max"
  return v > 0 && v < (int64_t{1} << 60) ? v : 0;
}

// The tightest limit named by `file` in `dir` and the directories above it up to `root`.
int64_t TightestLimit(const std::string& root, std::string dir, const std::string& file) {
  int64_t tightest = 0;
  while (true) {
    const int64_t v = ReadLimit(root + dir + "/" + file);
    if (v > 0 && (tightest == 0 || v < tightest)) tightest = v;
    if (dir.empty() || dir == "/") break;
    const size_t slash = dir.rfind('/');
    dir = slash == std::string::npos ? "" : dir.substr(0, slash);
  }
  return tightest;
}

// This process's memory limit from its cgroups (0: none found).
int64_t CgroupLimit(const std::string& cgroup_root, const std::string& self_cgroup) {
  std::ifstream in(self_cgroup);
  int64_t limit = 0;
  for (std::string line; std::getline(in, line);) {
    // "0::/path" (v2) or "4:memory:/path" (v1; the controllers may be a list).
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    int64_t v = 0;
    if (controllers.empty()) {
      v = TightestLimit(cgroup_root, path, "memory.max");
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      v = TightestLimit(cgroup_root + "/memory", path, "memory.limit_in_bytes");
    }
    if (v > 0 && (limit == 0 || v < limit)) limit = v;
  }
  return limit;
}

}  // namespace

bool MemoryBudget::TryTake(int64_t bytes) {
  int64_t now = used_.load(std::memory_order_relaxed);
  while (true) {
    if (now + bytes > limit_) return false;
    if (used_.compare_exchange_weak(now, now + bytes, std::memory_order_relaxed)) return true;
  }
}

int64_t DefaultMemoryBudget(const std::string& cgroup_root, const std::string& self_cgroup) {
  int64_t limit = CgroupLimit(cgroup_root, self_cgroup);
  if (limit == 0) {
    const int64_t pages = sysconf(_SC_PHYS_PAGES);
    const int64_t page = sysconf(_SC_PAGESIZE);
    limit = pages > 0 && page > 0 ? pages * page / 10 * 9 : int64_t{1} << 32;
  }
  const int64_t serving = std::max<int64_t>(int64_t{128} << 20, limit / 8);
  return std::max<int64_t>(limit - serving, limit / 2);
}

absl::Status MemoryBudgetFull(const std::string& table, const MemoryBudget& budget, int64_t rows,
                              int64_t row_bytes) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "table '", table, "': the memory budget for rows (", Mebibytes(budget.limit()),
      ") is full: ", Mebibytes(budget.used()), " taken, ", rows, " new row(s) of ", row_bytes,
      " bytes refused; raise --memory_limit, add shards, or give the table a row budget "
      "with eviction and a data directory so that cold rows leave memory ("
      "tessera-train's or tessera-cli create's --max_rows and --eviction=lru, and "
      "--data_dir on tessera-train or the shards)"));
}

std::string Mebibytes(int64_t bytes) {
  if (bytes < (1 << 20)) return absl::StrCat(bytes, " bytes");
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20));
}

}  // namespace tessera::embedding
