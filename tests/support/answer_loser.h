#ifndef TESSERA_TESTS_SUPPORT_ANSWER_LOSER_H_
#define TESSERA_TESTS_SUPPORT_ANSWER_LOSER_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/server_interceptor.h"

namespace tessera::testing {

// Faults between a server and its callers, injected by a gRPC server interceptor (so any
// service can have them, unchanged): the answer of a call the server carried out is lost
// (the caller sees UNAVAILABLE "injected: applied, answer lost" and must not apply it
// twice when it retries), or a call is refused before the service acts on it (its request
// is emptied, so the service changes nothing, and the caller sees UNAVAILABLE
// "injected"). set_code(CANCELLED) answers both as a server shutting down does instead.
// Thread-safe; must outlive the servers it is installed in.
class AnswerLoser {
 public:
  // Methods are matched by the end of their full name: "/BatchPush", "Table".
  explicit AnswerLoser(std::vector<std::string> losable) : losable_(std::move(losable)) {}

  // The next `n` successful calls of a losable method lose their answers, after the
  // `after` successful calls that come first.
  void LoseAnswers(int n, int after = 0) {
    skip_.store(after);
    lose_.store(n);
  }
  int answers_left_to_lose() const { return lose_.load(); }
  // The code the faults answer: UNAVAILABLE (a connection lost) unless set.
  void set_code(grpc::StatusCode code) { code_.store(code); }
  // The next `n` calls of `method` (a name's end) are refused before the service sees them.
  void RefuseNext(const std::string& method, int n);
  // Calls of losable methods answered, successful or not, answers lost or not.
  int calls() const { return calls_.load(); }

  // Pass to grpc::ServerBuilder::experimental().SetInterceptorCreators.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> Factory();

 private:
  friend class AnswerLosingInterceptor;
  bool Losable(const std::string& method) const;
  // Takes one refusal of `method`, if any are left.
  bool TakeRefusal(const std::string& method);

  const std::vector<std::string> losable_;
  std::atomic<grpc::StatusCode> code_{grpc::StatusCode::UNAVAILABLE};
  std::atomic<int> lose_{0};
  std::atomic<int> skip_{0};
  std::atomic<int> calls_{0};
  absl::Mutex mu_;
  std::string refused_method_ ABSL_GUARDED_BY(mu_);
  int refusals_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_SUPPORT_ANSWER_LOSER_H_
