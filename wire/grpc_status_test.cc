#include "wire/grpc_status.h"

#include "gtest/gtest.h"

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

}  // namespace
}  // namespace tessera::wire
