#ifndef TESSERA_CLIENT_RECONNECTING_STUB_H_
#define TESSERA_CLIENT_RECONNECTING_STUB_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"

namespace tessera::client {

// The stub of one server's gRPC service, on a channel that is replaced when it is stuck.
// With Debian's gRPC, a channel whose connect attempt found the server down reports
// TRANSIENT_FAILURE to every later call, even after the server is back, until something
// kicks it; a fresh channel dials at once. Callers Reset() after an UNAVAILABLE.
// Thread-safe.
template <typename Service>
class ReconnectingStub {
 public:
  using Stub = typename Service::Stub;

  // `credentials`: null for plaintext.
  ReconnectingStub(std::string address, grpc::ChannelArguments args,
                   std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr)
      : address_(std::move(address)),
        args_(std::move(args)),
        credentials_(credentials ? std::move(credentials) : grpc::InsecureChannelCredentials()) {
    channel_ = NewChannel();
    stub_ = Service::NewStub(channel_);
  }

  // The current stub, shared: a call made on it keeps its channel alive.
  std::shared_ptr<Stub> Get() const {
    absl::MutexLock lock(&mu_);
    return stub_;
  }

  // Replaces the channel when it is in TRANSIENT_FAILURE; otherwise asks it to connect.
  void Reset() {
    absl::MutexLock lock(&mu_);
    if (channel_->GetState(/*try_to_connect=*/true) != GRPC_CHANNEL_TRANSIENT_FAILURE) return;
    channel_ = NewChannel();
    stub_ = Service::NewStub(channel_);
  }

  const std::string& address() const { return address_; }

 private:
  std::shared_ptr<grpc::Channel> NewChannel() {
    return grpc::CreateCustomChannel(address_, credentials_, args_);
  }

  const std::string address_;
  grpc::ChannelArguments args_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  mutable absl::Mutex mu_;
  std::shared_ptr<grpc::Channel> channel_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Stub> stub_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::client

#endif  // TESSERA_CLIENT_RECONNECTING_STUB_H_
