#include "tests/support/answer_loser.h"

#include "absl/strings/match.h"
#include "google/protobuf/message.h"

namespace tessera::testing {

using grpc::experimental::InterceptionHookPoints;

class AnswerLosingInterceptor final : public grpc::experimental::Interceptor {
 public:
  AnswerLosingInterceptor(AnswerLoser* loser, std::string method)
      : loser_(loser), method_(std::move(method)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        loser_->TakeRefusal(method_)) {
      // The service sees an empty request and refuses it without changing anything.
      void* request = methods->GetRecvMessage();
      if (request != nullptr) static_cast<google::protobuf::Message*>(request)->Clear();
      refused_ = true;
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      if (refused_) {
        methods->ModifySendStatus(grpc::Status(loser_->code_.load(), "injected"));
      } else if (loser_->Losable(method_)) {
        loser_->calls_.fetch_add(1);
        if (methods->GetSendStatus().ok() && loser_->skip_.fetch_sub(1) <= 0 &&
            loser_->lose_.fetch_sub(1) > 0) {
          methods->ModifySendStatus(
              grpc::Status(loser_->code_.load(), "injected: applied, answer lost"));
        }
      }
    }
    methods->Proceed();
  }

 private:
  AnswerLoser* const loser_;
  const std::string method_;
  bool refused_ = false;
};

namespace {

class Factory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit Factory(AnswerLoser* loser) : loser_(loser) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new AnswerLosingInterceptor(loser_, info->method());
  }

 private:
  AnswerLoser* const loser_;
};

}  // namespace

void AnswerLoser::RefuseNext(const std::string& method, int n) {
  absl::MutexLock lock(&mu_);
  refused_method_ = method;
  refusals_ = n;
}

bool AnswerLoser::Losable(const std::string& method) const {
  for (const std::string& end : losable_) {
    if (absl::EndsWith(method, end)) return true;
  }
  return false;
}

bool AnswerLoser::TakeRefusal(const std::string& method) {
  absl::MutexLock lock(&mu_);
  if (refusals_ <= 0 || !absl::EndsWith(method, refused_method_)) return false;
  --refusals_;
  return true;
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> AnswerLoser::Factory() {
  return std::make_unique<testing::Factory>(this);
}

}  // namespace tessera::testing
