// tessera-serve: a serving replica of one model. Starts from every shard's rows, follows
// the training cluster's change logs and the dense network the trainer publishes, and
// serves Serving (Lookup, BatchLookup, Predict, Status), gRPC health (SERVING once caught up
// within --max_lag_s) and reflection.
#include <atomic>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/command_line.h"
#include "base/status.h"
#include "client/channel_policy.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "observability/logging.h"
#include "observability/metrics.h"
#include "server/auth.h"
#include "server/serving.h"
#include "serving/replica.h"
#include "serving/serving_service.h"
#include "wire/security_flags.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "address to bind (loopback unless told otherwise)");
ABSL_FLAG(int, port, 0, "port to listen on; 0 picks a free one and prints it");
ABSL_FLAG(std::string, coordinator, "127.0.0.1:7000", "the training cluster's coordinator");
ABSL_FLAG(std::string, model, "dlrm", "the model served: its tables '<model>.*'");
ABSL_FLAG(std::string, tables, "",
          "comma-separated tables of the model to serve (a large model spread over several "
          "replicas); empty = every table of it");
ABSL_FLAG(std::string, format, "fp32", "how rows are held: fp32 (as trained), fp16 or int8");
ABSL_FLAG(int, poll_ms, 100, "pause between rounds of reading the shards' changes");
ABSL_FLAG(double, max_lag_s, 10,
          "readiness: SERVING while every shard was read to its head within this many seconds "
          "(and a dense network is held, unless --lookup_only)");
ABSL_FLAG(bool, lookup_only, false, "ready without a published dense network (Lookup only)");
ABSL_FLAG(int64_t, max_batch_ids, 1 << 20, "ids per request before RESOURCE_EXHAUSTED");
ABSL_FLAG(int, max_message_bytes, tessera::client::kMaxMessageBytes,
          "largest gRPC message accepted or sent");
ABSL_FLAG(std::string, state_dir, "",
          "where the replica keeps its rows, cursors and dense network (every --save_every_s "
          "and at shutdown), so that a restart reads on from there; empty = nothing kept, a "
          "restart reads every shard whole");
ABSL_FLAG(std::string, checkpoint, "",
          "serve this checkpoint of the model, frozen: a step, or 'newest' (its newest "
          "complete one); its rows are read from the checkpoint's files by the shards (which "
          "keep them: --data_dir) and its dense network from the checkpoint. Empty = follow "
          "training");
ABSL_FLAG(int, save_every_s, 60, "with --state_dir: seconds between saves of the state");
ABSL_FLAG(int, start_timeout_s, 120,
          "how long to keep trying to reach the cluster at start before giving up");

namespace tessera::serving {
namespace {

absl::StatusOr<ReplicaOptions> ReplicaOptionsFromFlags() {
  ReplicaOptions options;
  options.model = absl::GetFlag(FLAGS_model);
  options.tables = absl::StrSplit(absl::GetFlag(FLAGS_tables), ',', absl::SkipEmpty());
  TESSERA_ASSIGN_OR_RETURN(options.format,
                           embedding::ParseServingFormat(absl::GetFlag(FLAGS_format)));
  TESSERA_ASSIGN_OR_RETURN(options.client.security, wire::ClientSecurityFromFlags());
  options.client.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  if (absl::GetFlag(FLAGS_poll_ms) < 1 || absl::GetFlag(FLAGS_poll_ms) > 60000) {
    return absl::InvalidArgumentError("--poll_ms must be in [1, 60000]");
  }
  if (!(absl::GetFlag(FLAGS_max_lag_s) > 0)) {
    return absl::InvalidArgumentError("--max_lag_s must be > 0");
  }
  if (absl::GetFlag(FLAGS_save_every_s) < 1) {
    return absl::InvalidArgumentError("--save_every_s must be >= 1");
  }
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  const std::string checkpoint = absl::GetFlag(FLAGS_checkpoint);
  if (checkpoint == "newest") {
    options.checkpoint = -1;
  } else if (!checkpoint.empty()) {
    int64_t step = 0;
    if (!absl::SimpleAtoi(checkpoint, &step) || step < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--checkpoint must be a step (>= 0) or 'newest', not '", checkpoint, "'"));
    }
    options.checkpoint = step;
  }
  return options;
}

// The replica, once the cluster answers (a replica started beside its cluster waits).
absl::StatusOr<std::unique_ptr<Replica>> StartReplica(const ReplicaOptions& options) {
  const std::string coordinator = absl::GetFlag(FLAGS_coordinator);
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::seconds(absl::GetFlag(FLAGS_start_timeout_s));
  while (true) {
    absl::StatusOr<std::unique_ptr<Replica>> replica = Replica::Start(coordinator, options);
    // A checkpoint that is not there, or cannot be read, will not be by waiting.
    const bool final =
        absl::IsInvalidArgument(replica.status()) ||
        (options.checkpoint.has_value() &&
         (absl::IsNotFound(replica.status()) || absl::IsFailedPrecondition(replica.status()) ||
          absl::IsDataLoss(replica.status())));
    if (replica.ok() || final || std::chrono::steady_clock::now() > until) {
      return replica;
    }
    std::cerr << "tessera-serve: not started yet: " << replica.status().message() << "\n";
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

// The replica's gauges, read every second.
void WatchReplica(observability::Metrics* metrics, const Replica* replica) {
  auto& r = metrics->registry();
  auto& lag_steps =
      observability::NewGauge(r, "tessera_serving_lag_steps",
                              "Newest step the shards applied less the step the replica serves");
  auto& lag_seconds = observability::NewGauge(
      r, "tessera_serving_lag_seconds", "Seconds since every shard was last read to its head");
  auto& step =
      observability::NewGauge(r, "tessera_serving_step", "Training step every shard was read to");
  auto& dense =
      observability::NewGauge(r, "tessera_serving_dense_step", "Step of the dense weights served");
  auto& bytes =
      observability::NewGauge(r, "tessera_serving_stream_bytes", "Bytes read from the shards");
  auto& rows = prometheus::BuildGauge()
                   .Name("tessera_serving_rows")
                   .Help("Rows a served table holds")
                   .Register(r);
  metrics->Watch(
      [=, &lag_steps, &lag_seconds, &step, &dense, &bytes, &rows](observability::Metrics&) {
        v1::ServingStatusResponse s;
        ServingService::StatusOf(*replica, &s);
        lag_steps.Set(static_cast<double>(std::max<int64_t>(0, s.head_step() - s.serving_step())));
        lag_seconds.Set(s.seconds_since_caught_up());
        step.Set(static_cast<double>(s.serving_step()));
        dense.Set(static_cast<double>(s.dense_step()));
        bytes.Set(static_cast<double>(s.bytes_read()));
        for (const v1::ServingTableStatus& t : s.tables()) {
          rows.Add({{"table", t.table()}}).Set(static_cast<double>(t.rows()));
        }
      },
      std::chrono::seconds(1));
}

// Polls the cluster until `stop`, keeping the health status to readiness.
void Follow(Replica* replica, grpc::Server* server, const std::atomic<bool>* stop) {
  const auto pause = std::chrono::milliseconds(absl::GetFlag(FLAGS_poll_ms));
  const double max_lag = absl::GetFlag(FLAGS_max_lag_s);
  const bool lookup_only = absl::GetFlag(FLAGS_lookup_only);
  const bool keeps_state = !absl::GetFlag(FLAGS_state_dir).empty();
  const auto save_every = std::chrono::seconds(absl::GetFlag(FLAGS_save_every_s));
  auto saved_at = std::chrono::steady_clock::now();
  std::string last_error;
  while (!stop->load()) {
    absl::Status s = replica->Poll();
    if (s.ok() && keeps_state && std::chrono::steady_clock::now() - saved_at >= save_every) {
      s = Annotate(replica->Save(), "saving the replica's state");
      saved_at = std::chrono::steady_clock::now();
    }
    if (!s.ok() && s.ToString() != last_error) {
      std::cerr << "tessera-serve: " << s << "\n";
    }
    last_error = s.ok() ? "" : s.ToString();
    const bool ready = replica->seconds_since_caught_up() <= max_lag &&
                       (lookup_only || replica->dense() != nullptr);
    if (grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService()) {
      health->SetServingStatus(ready);
    }
    std::this_thread::sleep_for(pause);
  }
}

absl::Status Serve() {
  TESSERA_ASSIGN_OR_RETURN(const ReplicaOptions options, ReplicaOptionsFromFlags());
  TESSERA_ASSIGN_OR_RETURN(const server::ServerSecurity security,
                           server::ServerSecurityFromFlags());
  server::BlockShutdownSignals();
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Replica> replica, StartReplica(options));
  ServingServiceOptions so;
  so.max_batch_ids = absl::GetFlag(FLAGS_max_batch_ids);
  so.auth = server::CallAuthorizer(security);
  ServingService service(replica.get(), so);
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<observability::Metrics> metrics,
                           observability::StartMetricsFromFlags("serve"));
  if (metrics != nullptr) WatchReplica(metrics.get(), replica.get());
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  server::ListenOptions listen;
  listen.host = absl::GetFlag(FLAGS_host);
  listen.port = absl::GetFlag(FLAGS_port);
  listen.max_message_bytes = options.client.max_message_bytes;
  listen.credentials = server::MakeServerCredentials(security);
  listen.metrics = metrics.get();
  listen.service_name = v1::Serving::service_full_name();
  listen.reflection = true;
  int port = 0;
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<grpc::Server> server,
                           server::StartServer(&service, listen, &port));
  server->GetHealthCheckService()->SetServingStatus(false);  // until caught up
  const std::optional<int64_t> frozen = replica->frozen_step();
  std::cout << "tessera-serve: model '" << options.model << "'"
            << (frozen ? absl::StrCat(" checkpoint ", *frozen, " (frozen)") : "") << " ("
            << embedding::ServingFormatName(options.format) << " rows, " << replica->tables().size()
            << " table(s), " << replica->shards() << " shard(s)), listening on " << listen.host
            << ":" << port << std::endl;
  std::atomic<bool> stop{false};
  std::thread follower(Follow, replica.get(), server.get(), &stop);
  server::ServeUntilShutdownSignal(server.get(), "tessera-serve");
  stop = true;
  follower.join();
  if (!options.state_dir.empty()) {
    TESSERA_RETURN_IF_ERROR(Annotate(replica->Save(), "saving the replica's state"));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tessera::serving

int main(int argc, char** argv) {
  tessera::base::ParseCommandLine(
      argc, argv, "tessera-serve",
      "Serves a model's tables and dense network, following its training cluster:\n"
      "  tessera-serve --coordinator=127.0.0.1:7000 --model=dlrm --port=7100");
  absl::Status s = tessera::observability::ConfigureLoggingFromFlags("tessera-serve");
  if (s.ok()) s = tessera::serving::Serve();
  if (!s.ok()) {
    std::cerr << "tessera-serve: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
