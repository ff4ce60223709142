// tessera-row-memory: what a dynamic table's row costs in resident memory, against its
// payload (weights in their dtype and optimizer state; ids and meta are overhead).
//
// For every configuration (dim 16 and 64; SGD, Adagrad, row-wise Adagrad, Adam; fp32 and
// bf16) a child process creates a table, pushes `--rows` distinct ids into it (every row
// updated once, as training makes them) and reports how much its resident set grew per
// row, beside the bound 1.25 x payload + 16 bytes. `--check` exits 1 when a row costs more
// than the bound, allowing `--allowance_mib` per table for what does not grow with the
// rows (the huge page each row array has begun, the maps' last pages).
//
//   tessera-row-memory --rows=2000000

#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "embedding/embedding_table.h"
#include "tessera/v1/config.pb.h"

ABSL_FLAG(int64_t, rows, 2000000, "rows pushed into each table");
ABSL_FLAG(bool, check, false, "exit 1 when a configuration's rows cost more than the bound");
ABSL_FLAG(double, allowance_mib, 6.0, "resident memory per table not counted against its rows");
ABSL_FLAG(std::string, only, "", "run the configurations whose name contains this");

namespace tessera {
namespace {

using embedding::EmbeddingTable;

int64_t ResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  long size = 0, resident = 0;
  if (f == nullptr || std::fscanf(f, "%ld %ld", &size, &resident) != 2) resident = 0;
  if (f != nullptr) std::fclose(f);
  return static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE);
}

struct Config {
  int dim;
  v1::OptimizerType optimizer;
  v1::Dtype dtype;
  std::string Name() const {
    return std::to_string(dim) + "/" + v1::OptimizerType_Name(optimizer) + "/" +
           v1::Dtype_Name(dtype);
  }
  v1::TableConfig Table() const {
    v1::TableConfig c;
    c.set_name("t");
    c.set_dim(dim);
    c.set_dtype(dtype);
    c.mutable_optimizer()->set_type(optimizer);
    return c;
  }
};

// In the child: resident bytes the table grew by for `rows` rows (-1 on error).
int64_t MeasureChild(const Config& config, int64_t rows) {
  constexpr int64_t kBatch = 65536;
  std::vector<int64_t> ids(kBatch);
  std::vector<float> grads(static_cast<size_t>(kBatch) * config.dim, 1e-3f);
  auto table = EmbeddingTable::Create(config.Table());
  if (!table.ok()) return -1;
  const int64_t before = ResidentBytes();
  for (int64_t begin = 0, step = 0; begin < rows; begin += kBatch, ++step) {
    const int64_t n = std::min(kBatch, rows - begin);
    // Ids spread over the 64-bit space, as hashed features are.
    for (int64_t i = 0; i < n; ++i) {
      ids[i] = static_cast<int64_t>(static_cast<uint64_t>(begin + i) * 0x9E3779B97F4A7C15ULL >> 1);
    }
    if (!(*table)
             ->ApplyUniqueGradients(absl::MakeConstSpan(ids).first(n), grads.data(), step)
             .ok()) {
      return -1;
    }
  }
  if ((*table)->num_rows() != rows) return -1;
  return ResidentBytes() - before;
}

// Runs MeasureChild in a child process (so every table starts from the same heap).
int64_t Measure(const Config& config, int64_t rows) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    const int64_t grown = MeasureChild(config, rows);
    (void)!write(fds[1], &grown, sizeof(grown));
    _exit(0);
  }
  close(fds[1]);
  int64_t grown = -1;
  if (read(fds[0], &grown, sizeof(grown)) != sizeof(grown)) grown = -1;
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return grown;
}

int Main() {
  const int64_t rows = absl::GetFlag(FLAGS_rows);
  const double allowance = absl::GetFlag(FLAGS_allowance_mib) * (1 << 20);
  bool over = false;
  std::printf("%-24s %9s %11s %9s %10s %8s\n", "dim/optimizer/dtype", "payload", "RSS/row",
              "bound", "RSS/paid", "verdict");
  for (const int dim : {16, 64}) {
    for (const v1::OptimizerType opt : {v1::SGD, v1::ADAGRAD, v1::ROWWISE_ADAGRAD, v1::ADAM}) {
      for (const v1::Dtype dtype : {v1::FP32, v1::BF16}) {
        const Config config{dim, opt, dtype};
        if (config.Name().find(absl::GetFlag(FLAGS_only)) == std::string::npos) continue;
        const int64_t payload = EmbeddingTable::StoredRowBytes(config.Table()) - 8;
        const double bound = 1.25 * static_cast<double>(payload) + 16;
        const int64_t grown = Measure(config, rows);
        if (grown < 0) {
          std::printf("%-24s failed\n", config.Name().c_str());
          over = true;
          continue;
        }
        const double per_row = static_cast<double>(grown) / static_cast<double>(rows);
        const bool ok = static_cast<double>(grown) <= bound * static_cast<double>(rows) + allowance;
        over |= !ok;
        std::printf("%-24s %9lld %11.1f %9.1f %10.2f %8s\n", config.Name().c_str(),
                    static_cast<long long>(payload), per_row, bound,
                    per_row / static_cast<double>(payload), ok ? "ok" : "OVER");
      }
    }
  }
  return absl::GetFlag(FLAGS_check) && over ? 1 : 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Resident memory per row of a dynamic table, against its payload");
  absl::ParseCommandLine(argc, argv);
  return tessera::Main();
}
