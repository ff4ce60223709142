#include "wire/grpc_status.h"

#include "gtest/gtest.h"
#include "wire/security.h"

namespace tessera::wire {
namespace {

TEST(ToGrpcStatus, KeepsEveryCodeAndTheMessage) {
  const std::pair<absl::StatusCode, grpc::StatusCode> pairs[] = {
      {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
      {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
      {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
      {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
      {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
      {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
      {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
      {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
      {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
      {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
  };
  for (const auto& [a, g] : pairs) {
    grpc::Status s = ToGrpcStatus(absl::Status(a, "table 'user': boom"));
    EXPECT_EQ(s.error_code(), g);
    EXPECT_EQ(s.error_message(), "table 'user': boom");
  }
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

TEST(FromGrpcStatus, IsTheInverseOfToGrpcStatus) {
  for (int code = 0; code <= 16; ++code) {
    const absl::Status s(static_cast<absl::StatusCode>(code), code == 0 ? "" : "shard 2: gone");
    EXPECT_EQ(FromGrpcStatus(ToGrpcStatus(s)), s) << code;
  }
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::NOT_FOUND, "table 'ads' not found")),
            absl::NotFoundError("table 'ads' not found"));
}

// A failed first call names its likely cause once, however many layers explain it (the
// client's Connect, then the command line's report).
TEST(ExplainCoordinatorFailure, ExplainsAnUnreachableCoordinatorOnce) {
  const ClientSecurity plaintext;
  const absl::Status once = ExplainCoordinatorFailure(absl::UnavailableError("connection refused"),
                                                      "127.0.0.1:1", plaintext);
  EXPECT_EQ(once.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(once.message().find("pass --tls_ca_file"), absl::string_view::npos) << once;
  EXPECT_EQ(ExplainCoordinatorFailure(once, "127.0.0.1:1", plaintext), once);
  const absl::Status shard = ExplainCoordinatorFailure(absl::UnimplementedError("no such service"),
                                                       "127.0.0.1:1", plaintext);
  EXPECT_EQ(shard.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ExplainCoordinatorFailure(shard, "127.0.0.1:1", plaintext), shard);
}

}  // namespace
}  // namespace tessera::wire
