#ifndef TESSERA_OBSERVABILITY_METRICS_H_
#define TESSERA_OBSERVABILITY_METRICS_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/server_interceptor.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tessera::observability {

// The Prometheus metrics of one process, served as text at http://<host>:<port>/metrics
// (prometheus-cpp's exposer). Every metric is named tessera_* and labelled with the
// process's `role` (shard, coordinator, train). Thread-safe.
//
//   tessera_rpc_requests_total{method, code}      RPCs served, by method and status code
//   tessera_rpc_latency_seconds{method, code}      their latency (histogram)
//   tessera_rpc_in_flight                          RPCs being served now (the queue depth)
//   tessera_table_rows{table}, tessera_table_bytes{table}
//   tessera_table_evictions_total{table}, tessera_table_expirations_total{table}
//   tessera_table_admission_refused_total{table}   gradients dropped by feature admission
//   tessera_train_samples_per_second, _loss, _step, _samples   (tessera-train's progress,
//                                                  registered in trainer/train_main.cc)
class Metrics;

// One table's size and totals since the process started, as Metrics::ReadTables takes them.
struct TableReading {
  std::string table;
  int64_t rows = 0;
  int64_t bytes = 0;
  int64_t evictions = 0;
  int64_t expirations = 0;
  int64_t budget_bytes = 0;       // the collection's memory budget for rows (0: none)
  int64_t budget_used_bytes = 0;  // what all its tables' rows take of it
  int64_t admission_refused = 0;  // gradients dropped for ids not admitted
};

// Readings of every table of `tables`, an embedding::EmbeddingCollection (taken by shape so
// that base/ stays beneath the embedding library): tables it cannot read are left out.
template <typename Collection>
std::vector<TableReading> ReadingsOf(Collection* tables) {
  std::vector<TableReading> out;
  auto configs = tables->ListTables();
  if (!configs.ok()) return out;
  for (const auto& config : *configs) {
    auto usage = tables->Usage(config.name());
    if (!usage.ok()) continue;
    out.push_back({config.name(), usage->rows, usage->memory_bytes, usage->evictions,
                   usage->expirations, usage->budget_bytes, usage->budget_used_bytes,
                   usage->admission_refused});
  }
  return out;
}

// From --metrics_port (-1, the default: none, and null is returned; 0 picks a port) and
// --metrics_host (127.0.0.1), with a log line naming where. Unavailable when it cannot
// listen.
absl::StatusOr<std::unique_ptr<Metrics>> StartMetricsFromFlags(const std::string& role);

// A gauge without labels, `name` with `help`, registered in `registry`.
prometheus::Gauge& NewGauge(prometheus::Registry& registry, const std::string& name,
                            const std::string& help);

class Metrics {
 public:
  // Serves on `host`:`port` (0 picks a free port). Unavailable when it cannot listen.
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const std::string& host, int port,
                                                        const std::string& role);
  ~Metrics();

  int port() const { return port_; }
  prometheus::Registry& registry() { return *registry_; }

  // Pass to grpc::ServerBuilder: counts and times every RPC of the server.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> RpcInterceptors();

  // Calls `read` now and then every `interval` on a thread of its own, until StopWatching
  // (or destruction): for readings that are cheaper to take now and then than on every
  // change (table sizes, shard health). One watcher per Metrics.
  void Watch(std::function<void(Metrics&)> read, std::chrono::milliseconds interval);
  void StopWatching();
  // One reading of the table metrics now: gauges are set, counters move by what each
  // total gained since the last reading.
  void ReadTables(const std::vector<TableReading>& tables);

  void ObserveRpc(const std::string& method, grpc::StatusCode code, double seconds);
  prometheus::Gauge& in_flight() { return *in_flight_; }

 private:
  Metrics(std::unique_ptr<prometheus::Exposer> exposer, const std::string& role);

  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Registry> registry_;
  int port_ = 0;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Histogram>* latency_;
  prometheus::Gauge* in_flight_;
  prometheus::Family<prometheus::Gauge>* table_rows_;
  prometheus::Family<prometheus::Gauge>* table_bytes_;
  prometheus::Gauge* budget_bytes_;       // tessera_memory_budget_bytes
  prometheus::Gauge* budget_used_bytes_;  // tessera_memory_budget_used_bytes
  prometheus::Family<prometheus::Counter>* evictions_;
  prometheus::Family<prometheus::Counter>* expirations_;
  // tessera_table_admission_refused_total
  prometheus::Family<prometheus::Counter>* admission_refused_;
  absl::Mutex mu_;
  std::map<std::string, int64_t> seen_evictions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> seen_expirations_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> seen_refused_ ABSL_GUARDED_BY(mu_);
  absl::Mutex watch_mu_;
  bool stop_ ABSL_GUARDED_BY(watch_mu_) = false;
  std::thread watcher_;
};

}  // namespace tessera::observability

#endif  // TESSERA_OBSERVABILITY_METRICS_H_
