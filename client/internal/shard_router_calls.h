#ifndef TESSERA_CLIENT_INTERNAL_SHARD_ROUTER_CALLS_H_
#define TESSERA_CLIENT_INTERNAL_SHARD_ROUTER_CALLS_H_

// ShardRouter's fan-out of one call to many shards, with its retries: templates over the
// request and answer types, for the router's files.

#include <functional>
#include <vector>

#include "absl/strings/numbers.h"
#include "client/shard_router.h"
#include "grpcpp/grpcpp.h"
#include "wire/call_metadata.h"

namespace tessera::client {

template <typename Response, typename Prepare>
std::vector<grpc::Status> ShardRouter::CallShards(const std::function<bool(int)>& has_work,
                                                  const Prepare& prepare,
                                                  std::vector<Response>* responses,
                                                  std::chrono::milliseconds deadline,
                                                  std::vector<uint64_t>* restarted) const {
  std::vector<grpc::Status> statuses(num_shards());
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts(num_shards());
  std::vector<std::unique_ptr<grpc::ClientAsyncResponseReader<Response>>> calls(num_shards());
  grpc::CompletionQueue queue;
  int pending = 0;
  // The incarnations before the calls: an answer from another one is a restart for this
  // call, even when a concurrent call heard of it first.
  std::vector<uint64_t> known(num_shards(), 0);
  for (int k = 0; k < num_shards(); ++k) {
    if (!has_work(k)) continue;
    known[k] = incarnations_[k].load();
    if (!serving(k)) {  // known down: fail now instead of waiting on it
      statuses[k] = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "down: failing its health checks; retry once it is back");
      continue;
    }
    contexts[k] = NewContext(deadline);
    calls[k] = prepare(k, contexts[k].get(), &queue);
    calls[k]->StartCall();
    calls[k]->Finish(&(*responses)[k], &statuses[k], reinterpret_cast<void*>(intptr_t{k}));
    ++pending;
  }
  void* tag = nullptr;
  bool ok = false;
  // Finish always completes (with the call's status, DEADLINE_EXCEEDED at the latest).
  for (; pending > 0 && queue.Next(&tag, &ok); --pending) {
  }
  queue.Shutdown();
  while (queue.Next(&tag, &ok)) {
  }
  for (int k = 0; k < num_shards(); ++k) {
    if (statuses[k].error_code() == grpc::StatusCode::UNAVAILABLE) stubs_[k]->Reset();
    if (contexts[k] == nullptr) continue;
    const auto& trailing = contexts[k]->GetServerTrailingMetadata();
    const auto it = trailing.find(wire::kIncarnationMetadata);
    const auto storage = trailing.find(wire::kStorageMetadata);
    uint64_t incarnation = 0;
    if (it == trailing.end() ||
        !absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &incarnation)) {
      continue;
    }
    const bool noted =
        NoteIncarnation(k, incarnation,
                        storage == trailing.end()
                            ? absl::string_view()
                            : absl::string_view(storage->second.data(), storage->second.size()));
    if (restarted != nullptr && (noted || (known[k] != 0 && incarnation != known[k]) ||
                                 incarnation != provisioned_[k].load())) {
      (*restarted)[k] = incarnation;
    }
  }
  return statuses;
}

template <typename Response, typename Prepare>
std::vector<grpc::Status> ShardRouter::CallShardsWithRetries(std::vector<bool> work,
                                                             const Prepare& prepare,
                                                             std::vector<Response>* responses,
                                                             std::chrono::milliseconds deadline,
                                                             bool reprovision) const {
  std::vector<grpc::Status> result(num_shards());
  std::vector<bool> reprovisioned(num_shards(), false);
  std::vector<bool> down(num_shards(), false);  // marked down before the first attempt
  for (int k = 0; k < num_shards(); ++k) down[k] = work[k] && !serving(k);
  int waits = 0;  // backoffs slept so far
  for (int attempt = 0;; ++attempt) {
    std::vector<uint64_t> restarted(num_shards(), 0);
    const std::vector<grpc::Status> statuses =
        CallShards([&](int k) { return static_cast<bool>(work[k]); }, prepare, responses, deadline,
                   &restarted);
    bool again = false, at_once = false;
    for (int k = 0; k < num_shards(); ++k) {
      if (!work[k]) continue;
      result[k] = statuses[k];
      const auto code = statuses[k].error_code();
      work[k] = !down[k] && (RetryCanFix(code) || code == grpc::StatusCode::DEADLINE_EXCEEDED);
      if (reprovision && restarted[k] != 0 && code == grpc::StatusCode::NOT_FOUND &&
          !reprovisioned[k]) {
        // Back empty: its tables are made again, then its part is sent again.
        reprovisioned[k] = true;
        ShardRestarted(k);
        provisioned_[k].store(restarted[k]);
        work[k] = true;
        at_once = true;
      } else if (reprovision && restarted[k] != 0 && code == grpc::StatusCode::OK) {
        provisioned_[k].store(restarted[k]);  // it served this call's tables: they are there
      }
      again = again || work[k];
    }
    if (!again || attempt >= options_.retry.max_retries) return result;
    retries_.fetch_add(std::count(work.begin(), work.end(), true));
    if (!at_once) std::this_thread::sleep_for(options_.retry.Backoff(waits++));
  }
}

}  // namespace tessera::client

#endif  // TESSERA_CLIENT_INTERNAL_SHARD_ROUTER_CALLS_H_
