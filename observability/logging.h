#ifndef TESSERA_OBSERVABILITY_LOGGING_H_
#define TESSERA_OBSERVABILITY_LOGGING_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "grpcpp/support/server_interceptor.h"
#include "spdlog/spdlog.h"

namespace tessera::observability {

// Structured logs on stderr through spdlog: every line has a time, a level, the process
// and key=value fields (or one JSON object per line with format "json").
struct LogOptions {
  std::string process = "tessera";  // "tessera-shard", ...
  std::string level = "info";       // trace, debug, info, warn, error, critical, off
  std::string format = "text";      // "text" (logfmt) or "json"
};

// Sets spdlog's default logger. InvalidArgument for an unknown level or format.
absl::Status ConfigureLogging(const LogOptions& options);

// The same from --log_level and --log_format (defined with it).
absl::Status ConfigureLoggingFromFlags(const std::string& process);

// One log line's fields, rendered as logfmt or JSON as configured.
class LogFields {
 public:
  LogFields& Add(std::string key, std::string value) {
    fields_.emplace_back(std::move(key), std::move(value));
    return *this;
  }
  LogFields& Add(std::string key, long long value) {
    return Add(std::move(key), std::to_string(value));
  }
  std::string Render() const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

// "NOT_FOUND", ...: gRPC's codes are the canonical codes absl names (the same numbering).
std::string CodeName(grpc::StatusCode code);

// Logs one message with fields at `level`.
void Log(spdlog::level::level_enum level, const std::string& message, const LogFields& fields);

// Pass to grpc::ServerBuilder: logs every RPC that fails, naming its method, status code
// and message, the table it named, this server's shard (-1: not a shard) and a request id
// (the caller's x-request-id metadata, else one made here, returned to the caller in the
// trailing metadata either way). Caller errors (bad argument, unknown table, stale map,
// refused token) are warnings; server faults (INTERNAL, DATA_LOSS, UNKNOWN, UNAVAILABLE,
// RESOURCE_EXHAUSTED from a full disk) are errors. Successful RPCs at debug level.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> RpcLogInterceptors(
    int shard_index);

}  // namespace tessera::observability

#endif  // TESSERA_OBSERVABILITY_LOGGING_H_
