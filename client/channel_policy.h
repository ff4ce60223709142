#ifndef TESSERA_CLIENT_CHANNEL_POLICY_H_
#define TESSERA_CLIENT_CHANNEL_POLICY_H_

// How every Tessera caller (the C++ client, the router, the coordinator's calls to its
// shards, tessera-cli) dials and retries: one retry policy and one set of channel
// arguments. The Python client's _RETRIES, _INITIAL_BACKOFF and _MAX_BACKOFF agree.

#include <algorithm>
#include <chrono>

#include "grpcpp/grpcpp.h"

namespace tessera::client {

// The largest gRPC message a client or server sends or accepts (a batch of a few million
// ids, a chunk of exported rows).
inline constexpr int kMaxMessageBytes = 256 << 20;

// Retries of a call that finds a server unavailable: up to max_retries more attempts,
// waiting initial_backoff after the first failure, doubled after each one up to
// max_backoff.
struct RetryPolicy {
  int max_retries = 8;                            // 0: fail at once
  std::chrono::milliseconds initial_backoff{50};  // doubled after each retry ...
  std::chrono::milliseconds max_backoff{1000};    // ... up to this

  // No retries: for callers whose own caller retries (a router inside a client).
  static RetryPolicy None() { return RetryPolicy{0}; }
  // The wait after failed attempt `attempt` (0 for the first).
  std::chrono::milliseconds Backoff(int attempt) const {
    std::chrono::milliseconds wait = initial_backoff;
    for (int i = 0; i < attempt && wait < max_backoff; ++i) wait *= 2;
    return std::min(wait, max_backoff);
  }
};

// Whether a failed call is worth sending again: UNAVAILABLE (the server was not reached,
// or the connection was lost), or CANCELLED, which a gRPC server that shuts down answers
// for calls it had received and not begun (grpc/grpc#41785): a coordinator or shard
// restarted with SIGTERM. Tessera's callers never retry a call they cancelled themselves,
// and every call they retry is safe to repeat (pushes carry their request ids).
inline bool RetryCanFix(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::CANCELLED;
}

// The coordinator's retries of a shard call (--shard_retries): fewer than a client's, as
// the client retries the whole call on top.
inline constexpr int kShardRetries = 4;

// Arguments of every client channel: send and receive limits of `max_message_bytes`, and
// a reconnect backoff of 100 ms up to 1 s, so that a restarted server is found again
// within a second (gRPC's own backoff, up to two minutes, would outlast the retries).
inline grpc::ChannelArguments ChannelArgs(int max_message_bytes = kMaxMessageBytes) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return args;
}

}  // namespace tessera::client

#endif  // TESSERA_CLIENT_CHANNEL_POLICY_H_
