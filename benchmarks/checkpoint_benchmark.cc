// Checkpoint and restore of one large table on a DurableCollection, next to the disk's
// own sequential write bandwidth measured in the same run (`vs_disk`: bytes the
// checkpoint put on disk per second over fsynced sequential writes per second).
//
//   tessera-checkpoint-benchmark --rows=10000000 --dim=64 --dir=/tmp/tessera-ckpt
//
// Phases: fill (every row updated once, so every row is dirty), full checkpoint,
// incremental checkpoint after 1% of the rows changed, restore of the first checkpoint,
// and a cold start (reopening the directory, as a restarted shard does).

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "base/command_line.h"
#include "base/status.h"
#include "embedding/storage/durable_collection.h"

ABSL_FLAG(int64_t, rows, 10'000'000, "rows in the table");
ABSL_FLAG(int, dim, 64, "embedding dimension");
ABSL_FLAG(int64_t, other_rows, 0,
          "rows of another model's table beside the timed one (model 'm'): > 0, a checkpoint "
          "of m writes out m's rows alone instead of hard-linking the store's files");
ABSL_FLAG(int, shards, 2, "in-memory shards of the collection");
ABSL_FLAG(std::string, dir, "/tmp/tessera-checkpoint-benchmark", "scratch directory (removed)");

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Bytes/s of 64 MiB sequential writes to a file in `dir`, fsynced at the end.
double DiskBytesPerSecond(const std::string& dir, int64_t bytes) {
  const std::string path = dir + "/disk-probe";
  std::vector<char> block(64 << 20, 'x');
  const auto start = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int64_t left = bytes;
  while (left > 0) {
    const ssize_t n = ::write(fd, block.data(), std::min<int64_t>(left, block.size()));
    if (n <= 0) break;
    left -= n;
  }
  ::fsync(fd);
  ::close(fd);
  const double s = Since(start);
  ::unlink(path.c_str());
  return static_cast<double>(bytes - left) / s;
}

// Another model's table like `t`, "other.t", with `rows` rows (none: nothing).
absl::Status AddOtherModel(embedding::EmbeddingCollection& c, v1::TableConfig t, int64_t rows) {
  if (rows <= 0) return absl::OkStatus();
  t.set_name("other.t");
  TESSERA_RETURN_IF_ERROR(c.CreateTable(t));
  std::vector<int64_t> ids(rows);
  for (int64_t i = 0; i < rows; ++i) ids[i] = i;
  return c.PushGradients("other.t", ids, std::vector<float>(rows * t.dim(), 0.01f), 1);
}

constexpr int64_t kBatch = 65536;  // ids per push

// Step 2's push of `changed` ids drawn uniformly from the `rows` of "m.big".
absl::Status PushRandomRows(embedding::EmbeddingCollection& c, int64_t rows, int64_t changed,
                            int dim) {
  std::mt19937_64 rng(1);
  std::vector<int64_t> ids;
  const std::vector<float> grads(kBatch * dim, 0.01f);
  for (int64_t done = 0; done < changed; done += kBatch) {
    const int64_t n = std::min(kBatch, changed - done);
    ids.resize(n);
    for (auto& id : ids) id = static_cast<int64_t>(rng() % rows);
    TESSERA_RETURN_IF_ERROR(
        c.PushGradients("m.big", ids, absl::MakeConstSpan(grads).subspan(0, n * dim), 2));
  }
  return absl::OkStatus();
}

int Run() {
  const int64_t rows = absl::GetFlag(FLAGS_rows);
  const int dim = absl::GetFlag(FLAGS_dim);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);

  storage::DurableOptions o;
  o.data_dir = dir + "/data";
  o.num_shards = absl::GetFlag(FLAGS_shards);
  o.keep_checkpoints = 0;
  o.log = [](const std::string& line) { std::printf("  %s\n", line.c_str()); };
  auto c = storage::DurableCollection::Open(o).value();
  v1::TableConfig t;
  t.set_name("m.big");
  t.set_dim(dim);
  t.mutable_optimizer()->set_type(v1::ROWWISE_ADAGRAD);
  t.mutable_optimizer()->set_learning_rate(0.05f);
  if (!c->CreateTable(t).ok()) return 1;
  if (!AddOtherModel(*c, t, absl::GetFlag(FLAGS_other_rows)).ok()) return 1;
  embedding::CheckpointOptions of_m;
  of_m.model = "m";
  embedding::RestoreOptions restore_m;
  restore_m.model = "m";

  std::vector<int64_t> ids(kBatch);
  std::vector<float> grads(kBatch * dim, 0.01f);
  auto start = Clock::now();
  for (int64_t begin = 0; begin < rows; begin += kBatch) {
    const int64_t n = std::min(kBatch, rows - begin);
    ids.resize(n);
    for (int64_t i = 0; i < n; ++i) ids[i] = begin + i;
    if (!c->PushGradients("m.big", ids, absl::MakeConstSpan(grads).subspan(0, n * dim), 1).ok()) {
      return 1;
    }
    if ((begin / kBatch) % 32 == 0) {
      std::printf("fill: %lld / %lld rows\n", static_cast<long long>(begin + n),
                  static_cast<long long>(rows));
      std::fflush(stdout);
    }
  }
  const double fill_s = Since(start);

  auto full = c->Checkpoint(1, {}, of_m);
  if (!full.ok()) {
    std::fprintf(stderr, "%s\n", full.status().ToString().c_str());
    return 1;
  }
  const int64_t changed = std::max<int64_t>(1, rows / 100);
  if (!PushRandomRows(*c, rows, changed, dim).ok()) return 1;
  auto incremental = c->Checkpoint(2, {}, of_m);
  auto restored = c->Restore(1, nullptr, restore_m);
  if (!incremental.ok() || !restored.ok()) return 1;
  c.reset();
  start = Clock::now();
  c = storage::DurableCollection::Open(o).value();
  const double cold_s = Since(start);
  const int64_t loaded = c->rows_loaded();
  c.reset();

  const double disk = DiskBytesPerSecond(dir, std::min<int64_t>(full->bytes, int64_t{2} << 30));
  std::printf("\nrows %lld x dim %d (row-wise Adagrad), %d in-memory shards\n",
              static_cast<long long>(rows), dim, o.num_shards);
  std::printf("%-26s %10s %12s %14s %10s\n", "phase", "seconds", "rows/s", "disk MB", "vs_disk");
  // vs_disk only where the phase writes all its bytes itself (a later checkpoint shares
  // table files with the one before through hard links).
  auto line = [&](const char* phase, double s, int64_t n, int64_t bytes, bool ratio) {
    std::printf("%-26s %10.2f %12.0f %14s %10s\n", phase, s, n / s,
                bytes > 0 ? absl::StrFormat("%.1f", bytes / 1e6).c_str() : "-",
                ratio ? absl::StrFormat("%.2f", bytes / s / disk).c_str() : "-");
  };
  line("fill (push every row)", fill_s, rows, 0, false);
  line("full checkpoint", full->seconds, rows, full->bytes, true);
  line("checkpoint after 1% push", incremental->seconds, changed, incremental->bytes, false);
  line("restore checkpoint 1", restored->seconds, rows, 0, false);
  line("cold start (reopen)", cold_s, loaded, 0, false);
  std::printf("disk: %.0f MB/s sequential fsynced writes\n", disk / 1e6);
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::base::ParseCommandLine(argc, argv, "tessera-checkpoint-benchmark",
                                   "Times checkpoint and restore of one large table.");
  return tessera::Run();
}
