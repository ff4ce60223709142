#include "observability/metrics.h"

#include <chrono>
#include <exception>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "observability/logging.h"

ABSL_FLAG(int, metrics_port, -1,
          "serve Prometheus metrics at http://--metrics_host:PORT/metrics; 0 picks a port, "
          "-1 = none");
ABSL_FLAG(std::string, metrics_host, "127.0.0.1", "address the metrics endpoint binds");

namespace tessera::observability {
namespace {

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  // 50 µs to 60 s: a lookup on loopback to a full checkpoint.
  static const prometheus::Histogram::BucketBoundaries buckets = {
      5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2,
      0.1,  0.25, 0.5,    1,    2.5,  5,      10,   30,   60};
  return buckets;
}

// Times one RPC from its arrival to its status, and counts it under its status code.
class RpcInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcInterceptor(Metrics* metrics, std::string method)
      : metrics_(metrics), method_(std::move(method)), start_(std::chrono::steady_clock::now()) {
    metrics_->in_flight().Increment();
  }
  // gRPC deletes the interceptor when the call is over, status sent or not.
  ~RpcInterceptor() override {
    if (!done_) Observe(grpc::StatusCode::CANCELLED);
    metrics_->in_flight().Decrement();
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS) &&
        !done_) {
      Observe(methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  void Observe(grpc::StatusCode code) {
    done_ = true;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    metrics_->ObserveRpc(method_, code, seconds);
  }

  Metrics* metrics_;
  std::string method_;
  std::chrono::steady_clock::time_point start_;
  bool done_ = false;
};

class RpcInterceptorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcInterceptorFactory(Metrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    // "/tessera.v1.EmbeddingShard/Lookup" -> "EmbeddingShard/Lookup"
    std::string method = info->method();
    const size_t dot = method.rfind('.', method.find('/', 1));
    if (dot != std::string::npos) method = method.substr(dot + 1);
    return new RpcInterceptor(metrics_, method);
  }

 private:
  Metrics* metrics_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& host, int port,
                                                        const std::string& role) {
  std::unique_ptr<prometheus::Exposer> exposer;
  const std::string address = absl::StrCat(host, ":", port);
  try {
    exposer = std::make_unique<prometheus::Exposer>(address, 1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  std::unique_ptr<Metrics> m(new Metrics(std::move(exposer), role));
  const std::vector<int> ports = m->exposer_->GetListeningPorts();
  m->port_ = ports.empty() ? port : ports[0];
  return m;
}

absl::StatusOr<std::unique_ptr<Metrics>> StartMetricsFromFlags(const std::string& role) {
  const int port = absl::GetFlag(FLAGS_metrics_port);
  if (port < 0) return std::unique_ptr<Metrics>();
  const std::string host = absl::GetFlag(FLAGS_metrics_host);
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Metrics> m, Metrics::Start(host, port, role));
  Log(spdlog::level::info, "metrics",
      LogFields().Add("url", absl::StrCat("http://", host, ":", m->port(), "/metrics")));
  return m;
}

Metrics::Metrics(std::unique_ptr<prometheus::Exposer> exposer, const std::string& role)
    : exposer_(std::move(exposer)), registry_(std::make_shared<prometheus::Registry>()) {
  const prometheus::Labels labels = {{"role", role}};
  requests_ = &prometheus::BuildCounter()
                   .Name("tessera_rpc_requests_total")
                   .Help("RPCs served, by method and status code")
                   .Labels(labels)
                   .Register(*registry_);
  latency_ = &prometheus::BuildHistogram()
                  .Name("tessera_rpc_latency_seconds")
                  .Help("Time from an RPC's arrival to its status, by method and status code")
                  .Labels(labels)
                  .Register(*registry_);
  in_flight_ = &prometheus::BuildGauge()
                    .Name("tessera_rpc_in_flight")
                    .Help("RPCs being served now")
                    .Labels(labels)
                    .Register(*registry_)
                    .Add({});
  table_rows_ = &prometheus::BuildGauge()
                     .Name("tessera_table_rows")
                     .Help("Rows held in memory, by table")
                     .Labels(labels)
                     .Register(*registry_);
  table_bytes_ = &prometheus::BuildGauge()
                      .Name("tessera_table_bytes")
                      .Help("Bytes of rows and id maps in memory, by table")
                      .Labels(labels)
                      .Register(*registry_);
  budget_bytes_ = &prometheus::BuildGauge()
                       .Name("tessera_memory_budget_bytes")
                       .Help("Bytes the rows of every table may take (--memory_limit; 0: none)")
                       .Labels(labels)
                       .Register(*registry_)
                       .Add({});
  budget_used_bytes_ = &prometheus::BuildGauge()
                            .Name("tessera_memory_budget_used_bytes")
                            .Help("Bytes the rows of every table take of the memory budget")
                            .Labels(labels)
                            .Register(*registry_)
                            .Add({});
  evictions_ = &prometheus::BuildCounter()
                    .Name("tessera_table_evictions_total")
                    .Help("Rows evicted to make room, by table")
                    .Labels(labels)
                    .Register(*registry_);
  expirations_ = &prometheus::BuildCounter()
                      .Name("tessera_table_expirations_total")
                      .Help("Rows dropped by their TTL, by table")
                      .Labels(labels)
                      .Register(*registry_);
  admission_refused_ =
      &prometheus::BuildCounter()
           .Name("tessera_table_admission_refused_total")
           .Help("Gradients dropped because their id was not admitted yet, by table")
           .Labels(labels)
           .Register(*registry_);
  exposer_->RegisterCollectable(registry_);
}

Metrics::~Metrics() { StopWatching(); }

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> Metrics::RpcInterceptors() {
  return std::make_unique<RpcInterceptorFactory>(this);
}

void Metrics::ObserveRpc(const std::string& method, grpc::StatusCode code, double seconds) {
  requests_->Add({{"method", method}, {"code", CodeName(code)}}).Increment();
  latency_->Add({{"method", method}, {"code", CodeName(code)}}, LatencyBuckets()).Observe(seconds);
}

void Metrics::ReadTables(const std::vector<TableReading>& tables) {
  absl::MutexLock lock(&mu_);
  for (const TableReading& t : tables) {
    const prometheus::Labels table = {{"table", t.table}};
    table_rows_->Add(table).Set(static_cast<double>(t.rows));
    table_bytes_->Add(table).Set(static_cast<double>(t.bytes));
    budget_bytes_->Set(static_cast<double>(t.budget_bytes));  // the same for every table
    budget_used_bytes_->Set(static_cast<double>(t.budget_used_bytes));
    // Counters move by what is new (and exist at 0).
    auto advance = [&table](prometheus::Family<prometheus::Counter>* family, int64_t* seen,
                            int64_t total) {
      prometheus::Counter& counter = family->Add(table);
      if (total > *seen) counter.Increment(static_cast<double>(total - *seen));
      *seen = std::max(*seen, total);
    };
    advance(evictions_, &seen_evictions_[t.table], t.evictions);
    advance(expirations_, &seen_expirations_[t.table], t.expirations);
    advance(admission_refused_, &seen_refused_[t.table], t.admission_refused);
  }
}

void Metrics::Watch(std::function<void(Metrics&)> read, std::chrono::milliseconds interval) {
  watcher_ = std::thread([this, read = std::move(read), interval] {
    absl::MutexLock lock(&watch_mu_);
    while (!stop_) {
      watch_mu_.Unlock();
      read(*this);
      watch_mu_.Lock();
      watch_mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(interval));
    }
  });
}

void Metrics::StopWatching() {
  {
    absl::MutexLock lock(&watch_mu_);
    stop_ = true;
  }
  if (watcher_.joinable()) watcher_.join();
}

prometheus::Gauge& NewGauge(prometheus::Registry& registry, const std::string& name,
                            const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
}

}  // namespace tessera::observability
