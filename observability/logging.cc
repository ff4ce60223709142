#include "observability/logging.h"

#include <atomic>
#include <chrono>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "google/protobuf/message.h"
#include "spdlog/sinks/stdout_sinks.h"

ABSL_FLAG(std::string, log_level, "info",
          "log level: trace, debug (every RPC), info, warn (failed calls), error, off");
ABSL_FLAG(std::string, log_format, "text", "log lines as text (logfmt) or json");

namespace tessera::observability {
namespace {

std::atomic<bool> json_format{false};

std::string JsonEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrCat("\\u00", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
        } else {
          out += c;
        }
    }
  }
  return out;
}

// logfmt: bare when the value has no blank, quote or '=', else quoted.
std::string LogfmtValue(const std::string& v) {
  if (!v.empty() && v.find_first_of(" \t\n\"=") == std::string::npos) return v;
  return absl::StrCat("\"", JsonEscape(v), "\"");
}

// The table a request names: its `table` field, or its `config.name` (CreateTable); "".
std::string TableOf(const google::protobuf::Message& m) {
  const auto* d = m.GetDescriptor();
  const auto* r = m.GetReflection();
  const auto* table = d->FindFieldByName("table");
  if (table != nullptr && table->type() == google::protobuf::FieldDescriptor::TYPE_STRING &&
      !table->is_repeated()) {
    return r->GetString(m, table);
  }
  const auto* config = d->FindFieldByName("config");
  if (config != nullptr && config->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE &&
      !config->is_repeated()) {
    const auto& c = r->GetMessage(m, config);
    const auto* name = c.GetDescriptor()->FindFieldByName("name");
    if (name != nullptr && name->type() == google::protobuf::FieldDescriptor::TYPE_STRING) {
      return c.GetReflection()->GetString(c, name);
    }
  }
  return "";
}

bool IsServerFault(grpc::StatusCode code) {
  return code == grpc::StatusCode::INTERNAL || code == grpc::StatusCode::DATA_LOSS ||
         code == grpc::StatusCode::UNKNOWN || code == grpc::StatusCode::UNAVAILABLE ||
         code == grpc::StatusCode::RESOURCE_EXHAUSTED;
}

std::atomic<uint64_t> next_request{1};

class RpcLogInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcLogInterceptor(grpc::experimental::ServerRpcInfo* info, int shard)
      : info_(info), shard_(shard), start_(std::chrono::steady_clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      const auto* metadata = methods->GetRecvInitialMetadata();
      auto it = metadata->find("x-request-id");
      request_id_ = it != metadata->end() ? std::string(it->second.data(), it->second.size())
                                          : absl::StrCat("r", next_request.fetch_add(1));
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE)) {
      // The sync protobuf services hand over the deserialised request here, and destroy it
      // before the status is sent: read its table now. Only Tessera's own services: the
      // health service, for one, reads raw byte buffers.
      const void* request = methods->GetRecvMessage();
      if (request != nullptr && absl::StartsWith(info_->method(), "/tessera.v1.")) {
        table_ = TableOf(*static_cast<const google::protobuf::Message*>(request));
      }
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      methods->GetSendTrailingMetadata()->emplace("x-request-id", request_id_);
      const grpc::Status status = methods->GetSendStatus();
      const auto level = status.ok()                          ? spdlog::level::debug
                         : IsServerFault(status.error_code()) ? spdlog::level::err
                                                              : spdlog::level::warn;
      if (spdlog::should_log(level)) {
        LogFields f;
        f.Add("method", info_->method()).Add("code", CodeName(status.error_code()));
        if (!table_.empty()) f.Add("table", table_);
        if (shard_ >= 0) f.Add("shard", shard_);
        f.Add("request", request_id_)
            .Add("ms", static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                  std::chrono::steady_clock::now() - start_)
                                                  .count()));
        if (!status.ok()) f.Add("error", status.error_message());
        Log(level, status.ok() ? "rpc" : "rpc failed", f);
      }
    }
    methods->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* info_;
  int shard_;
  std::chrono::steady_clock::time_point start_;
  std::string request_id_;
  std::string table_;
};

class RpcLogInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcLogInterceptorFactory(int shard) : shard_(shard) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new RpcLogInterceptor(info, shard_);
  }

 private:
  int shard_;
};

}  // namespace

absl::Status ConfigureLogging(const LogOptions& options) {
  const auto level = spdlog::level::from_str(options.level);
  if (level == spdlog::level::off && options.level != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown log level '", options.level,
                     "': expected trace, debug, info, warn, error, critical or off"));
  }
  if (options.format != "text" && options.format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown log format '", options.format, "': expected text or json"));
  }
  json_format = options.format == "json";
  auto logger = std::make_shared<spdlog::logger>(options.process,
                                                 std::make_shared<spdlog::sinks::stderr_sink_mt>());
  if (json_format) {
    logger->set_pattern(absl::StrCat(R"({"ts":"%Y-%m-%dT%H:%M:%S.%e","level":"%l","process":")",
                                     JsonEscape(options.process), R"(",%v})"));
  } else {
    logger->set_pattern(absl::StrCat(
        "ts=%Y-%m-%dT%H:%M:%S.%e level=%l process=", LogfmtValue(options.process), " %v"));
  }
  logger->set_level(level);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

absl::Status ConfigureLoggingFromFlags(const std::string& process) {
  LogOptions o;
  o.process = process;
  o.level = absl::GetFlag(FLAGS_log_level);
  o.format = absl::GetFlag(FLAGS_log_format);
  return ConfigureLogging(o);
}

std::string LogFields::Render() const {
  std::string out;
  for (const auto& [k, v] : fields_) {
    if (json_format) {
      absl::StrAppend(&out, out.empty() ? "" : ",", "\"", JsonEscape(k), "\":\"", JsonEscape(v),
                      "\"");
    } else {
      absl::StrAppend(&out, out.empty() ? "" : " ", k, "=", LogfmtValue(v));
    }
  }
  return out;
}

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

void Log(spdlog::level::level_enum level, const std::string& message, const LogFields& fields) {
  LogFields all;
  all.Add("msg", message);
  const std::string rest = fields.Render();
  const std::string head = all.Render();
  spdlog::log(level, "{}{}{}", head, rest.empty() ? "" : (json_format ? "," : " "), rest);
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> RpcLogInterceptors(
    int shard_index) {
  return std::make_unique<RpcLogInterceptorFactory>(shard_index);
}

}  // namespace tessera::observability
