// The data-parallel trainers' allreduce of the DLRM dense gradients
// (DataParallel::AllreduceMean: gloo's ring allreduce, then / N) against a raw gloo ring
// allreduce of the same bytes on a context of its own, both between 2 workers that are
// threads of this process over loopback TCP. The two alternate within one run, so
// `vs_raw` (raw µs / Tessera µs per allreduce) compares like with like.
//
// Sizes (arg "model"): 0, the dense parameters of tessera-train's default DLRM; 1, those
// of DLRM's Criteo configuration (bottom 512,256 -> emb_dim 64; top 512,256), as the CPU
// backend counts them; 2, one float, the latency of the ring alone.

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "gloo/allreduce.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/transport/tcp/device.h"
#include "trainer/data_parallel.h"
#include "trainer/dense_backend.h"

namespace tessera::trainer {
namespace {

constexpr int kWorkers = 2;

// Both workers' DataParallel and raw gloo contexts, made once.
struct Pair {
  InProcessRendezvous kv;
  std::unique_ptr<DataParallel> dp[kWorkers];
  gloo::rendezvous::HashStore store;
  std::shared_ptr<gloo::Context> raw[kWorkers];
};

Pair& Workers() {
  static Pair* pair = [] {
    auto* p = new Pair;
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorkers; ++r) {
      threads.emplace_back([p, r] {
        DataParallelOptions o;
        o.job = "allreduce-benchmark";
        o.num_workers = kWorkers;
        o.worker_index = r;
        p->dp[r] = DataParallel::Join(&p->kv, o).value();
        gloo::transport::tcp::attr attr;
        attr.hostname = "127.0.0.1";
        auto device = gloo::transport::tcp::CreateDevice(attr);
        auto context = std::make_shared<gloo::rendezvous::Context>(r, kWorkers);
        context->connectFullMesh(p->store, device);
        p->raw[r] = context;
      });
    }
    for (auto& t : threads) t.join();
    return p;
  }();
  return *pair;
}

void RawAllreduce(const std::shared_ptr<gloo::Context>& context, std::vector<float>& v) {
  gloo::AllreduceOptions opts(context);
  opts.setOutput(v.data(), v.size());
  opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
  void (*sum)(void*, const void*, const void*, size_t) = &gloo::sum<float>;
  opts.setReduceFunction(sum);
  opts.setTag(7);
  gloo::allreduce(opts);
}

// Arg 0: tessera-train's default DLRM; 1: DLRM's Criteo configuration; 2: one float (the
// ring's latency alone).
size_t DenseFloats(int which) {
  if (which == 2) return 1;
  DlrmConfig c;
  if (which == 1) {
    c.emb_dim = 64;
    c.bottom_mlp = {512, 256};
    c.top_mlp = {512, 256};
  }
  return NewCpuDenseBackend(c).value()->Parameters().size();
}

// Each iteration is one Tessera allreduce and one raw one, timed apart; worker 1 does the
// same on a thread.
void BM_DenseGradientAllreduce(benchmark::State& state) {
  Pair& p = Workers();
  const size_t n = DenseFloats(static_cast<int>(state.range(0)));
  const int64_t iterations = state.max_iterations;
  std::vector<float> peer(n, 1.0f);
  // Which of the two goes first alternates, so neither always finds the other's warm
  // caches or woken threads.
  std::thread worker1([&] {
    for (int64_t i = 0; i < iterations; ++i) {
      if (i % 2 == 0) {
        (void)p.dp[1]->AllreduceMean(absl::MakeSpan(peer));
        RawAllreduce(p.raw[1], peer);
      } else {
        RawAllreduce(p.raw[1], peer);
        (void)p.dp[1]->AllreduceMean(absl::MakeSpan(peer));
      }
    }
  });
  std::vector<float> v(n, 1.0f);
  double tessera_s = 0, raw_s = 0;
  using Clock = std::chrono::steady_clock;
  int64_t i = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    if (i % 2 == 0) {
      benchmark::DoNotOptimize(p.dp[0]->AllreduceMean(absl::MakeSpan(v)));
      const auto t1 = Clock::now();
      RawAllreduce(p.raw[0], v);
      tessera_s += std::chrono::duration<double>(t1 - t0).count();
      raw_s += std::chrono::duration<double>(Clock::now() - t1).count();
    } else {
      RawAllreduce(p.raw[0], v);
      const auto t1 = Clock::now();
      benchmark::DoNotOptimize(p.dp[0]->AllreduceMean(absl::MakeSpan(v)));
      raw_s += std::chrono::duration<double>(t1 - t0).count();
      tessera_s += std::chrono::duration<double>(Clock::now() - t1).count();
    }
    ++i;
  }
  worker1.join();
  const double k = static_cast<double>(state.iterations());
  state.counters["floats"] = static_cast<double>(n);
  state.counters["tessera_us"] = tessera_s / k * 1e6;
  state.counters["raw_us"] = raw_s / k * 1e6;
  state.counters["vs_raw"] = raw_s / tessera_s;
  state.counters["tessera_MBps"] = n * 4.0 * k / tessera_s / 1e6;
}
BENCHMARK(BM_DenseGradientAllreduce)
    ->ArgName("model")
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Iterations(2000)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tessera::trainer
