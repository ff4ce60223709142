#include "trainer/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <exception>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"

namespace tessera::trainer {
namespace {

// gloo's rendezvous store over a RendezvousKv, under a prefix of the job's generation.
// gloo reports a store failure as an exception; Join turns it into a status.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(RendezvousKv* kv, std::string prefix, std::chrono::milliseconds timeout)
      : kv_(kv), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(kv_->Set(prefix_ + key, std::string(data.begin(), data.end())));
  }
  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::vector<std::string>> v = kv_->Get({prefix_ + key}, timeout_);
    Check(v.status());
    return std::vector<char>((*v)[0].begin(), (*v)[0].end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(prefix_ + k);
    Check(kv_->Get(full, timeout).status());
  }

 private:
  static void Check(const absl::Status& s) {
    if (!s.ok()) throw std::runtime_error(s.ToString());
  }
  RendezvousKv* kv_;
  const std::string prefix_;
  const std::chrono::milliseconds timeout_;
};

}  // namespace

struct InProcessRendezvous::State {
  absl::Mutex mu;
  std::map<std::string, std::string> values ABSL_GUARDED_BY(mu);
};

InProcessRendezvous::InProcessRendezvous() : state_(std::make_unique<State>()) {}
InProcessRendezvous::~InProcessRendezvous() = default;

absl::Status InProcessRendezvous::Set(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&state_->mu);
  state_->values[key] = value;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> InProcessRendezvous::Get(
    const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  State& st = *state_;
  absl::MutexLock lock(&st.mu);
  auto all_there = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (const std::string& k : keys) {
      if (st.values.count(k) == 0) return false;
    }
    return true;
  };
  if (!st.mu.AwaitWithTimeout(absl::Condition(&all_there), absl::FromChrono(timeout))) {
    return absl::DeadlineExceededError(
        absl::StrCat("rendezvous: keys missing after ", timeout.count(), " ms"));
  }
  std::vector<std::string> out;
  for (const auto& k : keys) out.push_back(st.values[k]);
  return out;
}

absl::StatusOr<int64_t> InProcessRendezvous::Add(const std::string& key, int64_t delta) {
  absl::MutexLock lock(&state_->mu);
  int64_t value = 0;
  auto it = state_->values.find(key);
  if (it != state_->values.end() && !absl::SimpleAtoi(it->second, &value)) {
    return absl::FailedPreconditionError(absl::StrCat("key '", key, "' is not a counter"));
  }
  value += delta;
  state_->values[key] = absl::StrCat(value);
  return value;
}

DataParallel::~DataParallel() = default;

std::string DataParallel::Key(const std::string& name) const {
  return absl::StrCat("tessera/job/", options_.job, "/", generation_, "/", name);
}

absl::StatusOr<std::unique_ptr<DataParallel>> DataParallel::Join(
    RendezvousKv* kv, const DataParallelOptions& options) {
  const int n = options.num_workers;
  if (n < 1 || options.worker_index < 0 || options.worker_index >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker index ", options.worker_index, " is not in [0, ", n, ")"));
  }
  if (options.job.empty()) return absl::InvalidArgumentError("a data-parallel job needs a name");
  // gloo writes to its sockets without MSG_NOSIGNAL: a worker that stops would otherwise
  // kill the others with SIGPIPE instead of failing their next collective with an error.
  std::signal(SIGPIPE, SIG_IGN);
  TESSERA_ASSIGN_OR_RETURN(int64_t joined,
                           kv->Add(absl::StrCat("tessera/job/", options.job, "/joined"), 1));
  std::unique_ptr<DataParallel> dp(new DataParallel(kv, options, (joined - 1) / n));
  TESSERA_ASSIGN_OR_RETURN(int64_t claims,
                           kv->Add(dp->Key(absl::StrCat("claim/", options.worker_index)), 1));
  if (claims > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job '", options.job, "': two workers say --worker_index=", options.worker_index,
        " (generation ", dp->generation_, "); give each worker its own index in [0, ", n, ")"));
  }
  // Every worker's arrival first, so that one that never comes is named.
  TESSERA_RETURN_IF_ERROR(
      kv->Set(dp->Key(absl::StrCat("member/", options.worker_index)), options.host));
  std::vector<std::string> members;
  for (int w = 0; w < n; ++w) members.push_back(dp->Key(absl::StrCat("member/", w)));
  absl::StatusOr<std::vector<std::string>> hosts = kv->Get(members, options.rendezvous_timeout);
  if (!hosts.ok()) {
    std::vector<int> missing;
    for (int w = 0; w < n; ++w) {
      if (!kv->Get({members[w]}, std::chrono::milliseconds(0)).ok()) missing.push_back(w);
    }
    return WithCause(
        absl::DeadlineExceededError(absl::StrCat(
            "job '", options.job, "': worker(s) ", absl::StrJoin(missing, ", "), " of ", n,
            " did not join within ", options.rendezvous_timeout.count() / 1000,
            " s; start every worker with the same --coordinator, --model and --num_workers")),
        Cause::kWorker);
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.host;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.worker_index, n);
    context->setTimeout(std::max(options.timeout, std::chrono::milliseconds(1000)));
    GlooStore store(kv, dp->Key("gloo/"), options.rendezvous_timeout);
    context->connectFullMesh(store, device);
    dp->context_ = std::move(context);
  } catch (const std::exception& e) {
    return WithCause(absl::UnavailableError(
                         absl::StrCat("job '", options.job, "': worker ", options.worker_index,
                                      " could not connect to the other workers (listening on ",
                                      options.host, "): ", e.what())),
                     Cause::kWorker);
  }
  return dp;
}

absl::Status DataParallel::Failed(const std::string& what, const std::string& detail) {
  // Every worker that is still running sees the collective fail soon: each says so in the
  // store, and those that do not within a few seconds are the ones that stopped.
  const std::string failed = absl::StrCat("failed/", next_tag_, "/");
  (void)kv_->Set(Key(absl::StrCat(failed, rank())), detail);
  std::vector<int> silent;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  for (int w = 0; w < size(); ++w) {
    if (w == rank()) continue;
    const auto left = std::max(std::chrono::milliseconds(0),
                               std::chrono::duration_cast<std::chrono::milliseconds>(
                                   until - std::chrono::steady_clock::now()));
    if (!kv_->Get({Key(absl::StrCat(failed, w))}, left).ok()) silent.push_back(w);
  }
  const std::string who =
      silent.empty()
          ? "every worker saw it fail"
          : absl::StrCat("worker ", absl::StrJoin(silent, ", worker "),
                         silent.size() == 1 ? " has" : " have", " stopped or cannot be reached");
  return WithCause(
      absl::AbortedError(absl::StrCat("job '", options_.job, "': ", what, " failed on worker ",
                                      rank(), ": ", who, " (", detail, ")")),
      Cause::kWorker);
}

template <typename Fn>
absl::Status DataParallel::Collective(const char* what, Fn&& run) {
  try {
    run(next_tag_);
  } catch (const std::exception& e) {
    return Failed(what, e.what());
  }
  ++next_tag_;
  return absl::OkStatus();
}

absl::Status DataParallel::AllreduceMean(absl::Span<float> values) {
  if (size() == 1 || values.empty()) return absl::OkStatus();
  const auto start = std::chrono::steady_clock::now();
  TESSERA_RETURN_IF_ERROR(Collective("the allreduce of the dense gradients", [&](uint32_t tag) {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(values.data(), values.size());
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    void (*sum)(void*, const void*, const void*, size_t) = &gloo::sum<float>;
    opts.setReduceFunction(sum);
    opts.setTag(tag);
    opts.setTimeout(options_.timeout);
    gloo::allreduce(opts);
  }));
  // × 1/N, a multiply the loop vectorises at full rate (a divide's throughput is far
  // lower); exact for N a power of two, and the same bits on every worker whatever N.
  const float inverse = 1.0f / static_cast<float>(size());
  for (float& v : values) v *= inverse;
  allreduce_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++allreduces_;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> DataParallel::AllGather(const std::string& mine) {
  std::vector<char> out(mine.size() * size());
  if (size() > 1) {
    std::vector<char> in(mine.begin(), mine.end());
    TESSERA_RETURN_IF_ERROR(Collective("an allgather", [&](uint32_t tag) {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(in.data(), in.size());
      opts.setOutput(out.data(), out.size());
      opts.setTag(tag);
      opts.setTimeout(options_.timeout);
      gloo::allgather(opts);
    }));
  } else {
    std::copy(mine.begin(), mine.end(), out.begin());
  }
  std::vector<std::string> each;
  for (int w = 0; w < size(); ++w) {
    each.emplace_back(out.begin() + w * mine.size(), out.begin() + (w + 1) * mine.size());
  }
  return each;
}

absl::Status DataParallel::Broadcast(std::string* bytes, int root,
                                     std::chrono::milliseconds timeout) {
  if (size() == 1) return absl::OkStatus();
  // The size first (every worker's, of which the root's counts), then the bytes.
  uint64_t n = bytes->size();
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::string> sizes,
                           AllGather(std::string(reinterpret_cast<const char*>(&n), sizeof(n))));
  std::memcpy(&n, sizes[root].data(), sizeof(n));
  bytes->resize(n);
  if (n == 0) return absl::OkStatus();
  return Collective("a broadcast", [&](uint32_t tag) {
    gloo::BroadcastOptions opts(context_);
    opts.setRoot(root);
    opts.setOutput(bytes->data(), bytes->size());
    opts.setTag(tag);
    opts.setTimeout(timeout.count() > 0 ? timeout : options_.timeout);
    gloo::broadcast(opts);
  });
}

absl::Status DataParallel::Barrier(std::chrono::milliseconds timeout) {
  if (size() == 1) return absl::OkStatus();
  return Collective("a barrier", [&](uint32_t tag) {
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(timeout.count() > 0 ? timeout : options_.timeout);
    gloo::barrier(opts);
  });
}

absl::StatusOr<bool> AgreedEndSource::Next(Batch* batch) {
  if (ended_) return false;
  TESSERA_ASSIGN_OR_RETURN(bool more, inner_->Next(batch));
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::string> all, dp_->AllGather(more ? "1" : "0"));
  const bool everyone = std::all_of(all.begin(), all.end(), [](const auto& a) { return a == "1"; });
  ended_ = !everyone;
  return everyone;
}

uint64_t Fingerprint(absl::Span<const float> values) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over the bytes
  const auto* p = reinterpret_cast<const unsigned char*>(values.data());
  for (size_t i = 0; i < values.size() * sizeof(float); ++i) {
    h = (h ^ p[i]) * 0x100000001b3ULL;
  }
  return h;
}

}  // namespace tessera::trainer
