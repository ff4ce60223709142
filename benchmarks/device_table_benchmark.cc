// tessera-device-table-benchmark: a device table's lookups and updates on the GPU against
// a flat gather of the same rows in the same run (vs_flat). Everything stays on the
// device: ids and gradients are copied in once, each figure is timed with CUDA events
// around the table's kernels (deduplication, map probes, gather or update), the median
// of --repeats rounds. Tables are filled with every row first; batches draw Zipf ids.
//
//   ./build/tessera-device-table-benchmark [--rows=10000000,100000000] [--dims=16,64]
//       [--batches=4096,65536]

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "base/command_line.h"
#include "base/cuda_status.h"
#include "base/status.h"
#include "base/zipf_sampler.h"
#include "embedding/device/device_table.h"
#include "embedding/device/device_table_kernels.h"
#include "embedding/device/table_layout.h"
#include "embedding/sharding.h"

ABSL_FLAG(std::string, rows, "10000000,100000000", "table sizes (rows, all created first)");
ABSL_FLAG(std::string, dims, "16,64", "embedding dimensions");
ABSL_FLAG(std::string, batches, "4096,65536", "ids per batch");
ABSL_FLAG(int, steps, 50, "timed batches per figure, each with ids of its own");
ABSL_FLAG(int, repeats, 3, "rounds; each figure is the median round's");
ABSL_FLAG(double, zipf, 1.05, "Zipf exponent of id popularity");
ABSL_FLAG(int, device, 0, "CUDA device");

namespace tessera {
namespace {

namespace kernels = embedding::device::kernels;
using embedding::device::TableLayout;
using embedding::device::TableView;

std::vector<int64_t> ParseList(const std::string& s) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (absl::SimpleAtoi(part, &v) && v > 0) out.push_back(v);
  }
  return out;
}

// Device memory for one run, freed at the end.
struct Arena {
  std::vector<void*> blocks;
  ~Arena() {
    for (void* p : blocks) cudaFree(p);
  }
  template <typename T>
  absl::StatusOr<T*> Get(size_t count) {
    void* p = nullptr;
    TESSERA_CUDA_RETURN(cudaMalloc(&p, std::max<size_t>(1, count) * sizeof(T)));
    blocks.push_back(p);
    return static_cast<T*>(p);
  }
};

struct Figures {
  double lookup_ids_per_s = 0, flat_ids_per_s = 0, update_ids_per_s = 0;
};

// Seconds of `fn` over `steps` batches, timed by events on `stream`.
template <typename Fn>
absl::StatusOr<double> Time(cudaStream_t stream, int steps, Fn fn) {
  cudaEvent_t start, stop;
  TESSERA_CUDA_RETURN(cudaEventCreate(&start));
  TESSERA_CUDA_RETURN(cudaEventCreate(&stop));
  TESSERA_CUDA_RETURN(cudaEventRecord(start, stream));
  for (int s = 0; s < steps; ++s) TESSERA_RETURN_IF_ERROR(fn(s));
  TESSERA_CUDA_RETURN(cudaEventRecord(stop, stream));
  TESSERA_CUDA_RETURN(cudaEventSynchronize(stop));
  float ms = 0;
  TESSERA_CUDA_RETURN(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / 1e3;
}

// One round of each figure at `batch` ids a step, on a table filled by Run.
absl::StatusOr<Figures> Measure(TableView t, int64_t rows, int dim, const float* flat,
                                int64_t* slots, int* flag, int batch, int round,
                                cudaStream_t stream) {
  Arena arena;
  const int steps = absl::GetFlag(FLAGS_steps);
  // Every step's ids (Zipf over the rows, ids scattered by a hash of the rank).
  base::ZipfSampler zipf(rows, absl::GetFlag(FLAGS_zipf));
  std::mt19937_64 rng(7 + round);
  std::vector<int64_t> all(static_cast<size_t>(steps) * batch);
  for (int64_t& id : all) {
    id = static_cast<int64_t>(embedding::Mix64(static_cast<uint64_t>(zipf(rng))) %
                              static_cast<uint64_t>(rows));
  }
  TESSERA_ASSIGN_OR_RETURN(int64_t * step_ids, arena.Get<int64_t>(all.size()));
  TESSERA_CUDA_RETURN(cudaMemcpyAsync(step_ids, all.data(), all.size() * sizeof(int64_t),
                                      cudaMemcpyHostToDevice, stream));
  const size_t b = static_cast<size_t>(batch);
  TESSERA_ASSIGN_OR_RETURN(int64_t * sorted, arena.Get<int64_t>(b));
  TESSERA_ASSIGN_OR_RETURN(int32_t * iota, arena.Get<int32_t>(b));
  TESSERA_ASSIGN_OR_RETURN(int64_t * unique, arena.Get<int64_t>(b));
  TESSERA_ASSIGN_OR_RETURN(int32_t * num_unique, arena.Get<int32_t>(1));
  TESSERA_ASSIGN_OR_RETURN(int32_t * inverse, arena.Get<int32_t>(b));
  TESSERA_ASSIGN_OR_RETURN(int32_t * pos, arena.Get<int32_t>(b));
  TESSERA_ASSIGN_OR_RETURN(int32_t * begin, arena.Get<int32_t>(b));
  TESSERA_ASSIGN_OR_RETURN(int32_t * count, arena.Get<int32_t>(b));
  const size_t temp_bytes = kernels::DedupTempBytes(batch);
  TESSERA_ASSIGN_OR_RETURN(char* temp, arena.Get<char>(temp_bytes));
  TESSERA_ASSIGN_OR_RETURN(float* rows_out, arena.Get<float>(b * dim));
  TESSERA_ASSIGN_OR_RETURN(float* out, arena.Get<float>(b * dim));
  TESSERA_ASSIGN_OR_RETURN(float* grads, arena.Get<float>(b * dim));
  TESSERA_CUDA_RETURN(cudaMemsetAsync(grads, 0, b * dim * sizeof(float), stream));
  TESSERA_ASSIGN_OR_RETURN(unsigned long long* refused, arena.Get<unsigned long long>(2));
  // Lookups as the table answers them: deduplicate, probe, gather, one row per id. The
  // distinct-id count comes back to the host, as DeviceTable reads it.
  int32_t n = 0;
  auto dedup = [&](int s) -> absl::Status {
    TESSERA_CUDA_RETURN(kernels::Dedup(step_ids + static_cast<size_t>(s) * b, batch, sorted, iota,
                                       unique, num_unique, inverse, pos, begin, count, temp,
                                       temp_bytes, stream));
    TESSERA_CUDA_RETURN(cudaMemcpyAsync(&n, num_unique, sizeof(n), cudaMemcpyDeviceToHost, stream));
    TESSERA_CUDA_RETURN(cudaStreamSynchronize(stream));
    return absl::OkStatus();
  };
  auto lookup = [&](int s) -> absl::Status {
    TESSERA_RETURN_IF_ERROR(dedup(s));
    TESSERA_CUDA_RETURN(kernels::FindOrClaim(t, unique, n, false, slots, flag, stream));
    TESSERA_CUDA_RETURN(kernels::Gather(t, unique, slots, n, rows_out, stream));
    TESSERA_CUDA_RETURN(kernels::Scatter(rows_out, dim, inverse, batch, out, stream));
    return absl::OkStatus();
  };
  auto flat_gather = [&](int s) -> absl::Status {
    TESSERA_CUDA_RETURN(
        kernels::FlatGather(flat, dim, step_ids + static_cast<size_t>(s) * b, batch, out, stream));
    return absl::OkStatus();
  };
  auto update = [&](int s) -> absl::Status {
    TESSERA_RETURN_IF_ERROR(dedup(s));
    TESSERA_CUDA_RETURN(kernels::FindOrClaim(t, unique, n, false, slots, flag, stream));
    TESSERA_CUDA_RETURN(kernels::Update(t, unique, slots, grads, n, s, refused,
                                        reinterpret_cast<long long*>(refused + 1), stream));
    return absl::OkStatus();
  };
  Figures f;
  TESSERA_ASSIGN_OR_RETURN(double lookup_s, Time(stream, steps, lookup));
  TESSERA_ASSIGN_OR_RETURN(double flat_s, Time(stream, steps, flat_gather));
  TESSERA_ASSIGN_OR_RETURN(double update_s, Time(stream, steps, update));
  const double timed_ids = static_cast<double>(steps) * batch;
  f.lookup_ids_per_s = timed_ids / lookup_s;
  f.flat_ids_per_s = timed_ids / flat_s;
  f.update_ids_per_s = timed_ids / update_s;
  return f;
}

// A table of `rows` rows of `dim` (Adagrad, fp32) filled with every row, and a flat array
// of the same rows; then every batch size's figures, the median of --repeats rounds.
absl::Status Run(int64_t rows, int dim, const std::vector<int64_t>& batches, cudaStream_t stream) {
  v1::TableConfig config;
  config.set_name("bench");
  config.set_dim(dim);
  config.set_max_rows(rows);
  config.mutable_optimizer()->set_type(v1::ADAGRAD);
  TESSERA_ASSIGN_OR_RETURN(TableLayout layout, embedding::device::DescribeTable(config));
  Arena arena;
  TableView& t = layout.view;
  const uint64_t n_slots = t.slots + 1;
  TESSERA_ASSIGN_OR_RETURN(t.keys, arena.Get<uint64_t>(n_slots));
  TESSERA_ASSIGN_OR_RETURN(float* weights, arena.Get<float>(n_slots * dim));
  t.weights = weights;
  TESSERA_ASSIGN_OR_RETURN(t.state, arena.Get<float>(n_slots * t.state_floats));
  TESSERA_ASSIGN_OR_RETURN(t.update_count, arena.Get<int64_t>(n_slots));
  TESSERA_ASSIGN_OR_RETURN(t.last_step, arena.Get<int64_t>(n_slots));
  TESSERA_ASSIGN_OR_RETURN(t.rows, arena.Get<unsigned long long>(1));
  TESSERA_CUDA_RETURN(cudaMemsetAsync(t.keys, 0xff, n_slots * sizeof(uint64_t), stream));
  TESSERA_CUDA_RETURN(cudaMemsetAsync(t.rows, 0, sizeof(unsigned long long), stream));
  // The flat table the gather is compared with: the same rows, no map.
  TESSERA_ASSIGN_OR_RETURN(float* flat, arena.Get<float>(static_cast<size_t>(rows) * dim));
  const size_t fill_chunk = 1 << 20;
  size_t per = fill_chunk;
  for (const int64_t b : batches) per = std::max<size_t>(per, static_cast<size_t>(b));
  TESSERA_ASSIGN_OR_RETURN(int64_t * ids, arena.Get<int64_t>(per));
  TESSERA_ASSIGN_OR_RETURN(int64_t * slots, arena.Get<int64_t>(per));
  TESSERA_ASSIGN_OR_RETURN(int* flag, arena.Get<int>(1));
  std::vector<int64_t> host(fill_chunk);
  for (int64_t first = 0; first < rows; first += fill_chunk) {
    const int32_t n = static_cast<int32_t>(std::min<int64_t>(fill_chunk, rows - first));
    for (int32_t i = 0; i < n; ++i) host[i] = first + i;
    TESSERA_CUDA_RETURN(
        cudaMemcpyAsync(ids, host.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice, stream));
    TESSERA_CUDA_RETURN(kernels::FindOrClaim(t, ids, n, true, slots, flag, stream));
    TESSERA_CUDA_RETURN(cudaStreamSynchronize(stream));
  }
  for (const int64_t batch : batches) {
    std::vector<Figures> rounds;
    for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
      TESSERA_ASSIGN_OR_RETURN(
          Figures f, Measure(t, rows, dim, flat, slots, flag, static_cast<int>(batch), r, stream));
      rounds.push_back(f);
    }
    std::sort(rounds.begin(), rounds.end(), [](const Figures& a, const Figures& b) {
      return a.lookup_ids_per_s / a.flat_ids_per_s < b.lookup_ids_per_s / b.flat_ids_per_s;
    });
    const Figures& m = rounds[rounds.size() / 2];
    std::printf("%12lld %4d %6lld %16.0f %16.0f %8.2f %16.0f %10.2f\n",
                static_cast<long long>(rows), dim, static_cast<long long>(batch),
                m.lookup_ids_per_s, m.flat_ids_per_s, m.lookup_ids_per_s / m.flat_ids_per_s,
                m.update_ids_per_s, m.update_ids_per_s / m.flat_ids_per_s);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

absl::Status Main() {
  TESSERA_RETURN_IF_ERROR(embedding::device::DeviceTable::Usable(absl::GetFlag(FLAGS_device)));
  TESSERA_CUDA_RETURN(cudaSetDevice(absl::GetFlag(FLAGS_device)));
  cudaStream_t stream;
  TESSERA_CUDA_RETURN(cudaStreamCreate(&stream));
  std::printf("%12s %4s %6s %16s %16s %8s %16s %10s\n", "rows", "dim", "batch", "lookup ids/s",
              "flat ids/s", "vs_flat", "update ids/s", "upd/flat");
  const std::vector<int64_t> batches = ParseList(absl::GetFlag(FLAGS_batches));
  for (const int64_t rows : ParseList(absl::GetFlag(FLAGS_rows))) {
    for (const int64_t dim : ParseList(absl::GetFlag(FLAGS_dims))) {
      TESSERA_RETURN_IF_ERROR(Run(rows, static_cast<int>(dim), batches, stream));
    }
  }
  cudaStreamDestroy(stream);
  return absl::OkStatus();
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::base::ParseCommandLine(argc, argv, "tessera-device-table-benchmark",
                                  "Times a device table's lookups and updates against a flat "
                                  "gather of the same rows, on the GPU.");
  const absl::Status s = tessera::Main();
  if (!s.ok()) {
    std::fprintf(stderr, "tessera-device-table-benchmark: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
