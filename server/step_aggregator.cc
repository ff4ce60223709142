#include "server/step_aggregator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status.h"

namespace tessera::server {
namespace {

// The step's tables merged in worker order: one part per table, its ids and gradients
// the workers' concatenated (worker 0's first).
struct Merged {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> ids;
  std::vector<std::vector<float>> grads;
  std::vector<embedding::TableGradients> parts;
};

void Merge(const std::vector<const Contribution*>& workers, Merged* m) {
  for (const Contribution* c : workers) {
    for (const embedding::TableGradients& t : c->tables) {
      auto it = std::find(m->names.begin(), m->names.end(), t.table);
      size_t at = static_cast<size_t>(it - m->names.begin());
      if (it == m->names.end()) {
        m->names.push_back(t.table);
        m->ids.emplace_back();
        m->grads.emplace_back();
      }
      m->ids[at].insert(m->ids[at].end(), t.ids.begin(), t.ids.end());
      m->grads[at].insert(m->grads[at].end(), t.gradients.begin(), t.gradients.end());
    }
  }
  for (size_t p = 0; p < m->names.size(); ++p) {
    m->parts.push_back({m->names[p], m->ids[p], m->grads[p]});
  }
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> StepAggregator::Contribute(const embedding::PushSync& member,
                                                                int64_t step,
                                                                const Contribution& part,
                                                                const ApplyFn& apply) {
  if (member.workers < 2 || member.worker < 0 || member.worker >= member.workers) {
    return absl::InvalidArgumentError(absl::StrCat("job '", member.job, "': worker ", member.worker,
                                                   " of ", member.workers,
                                                   " is not a worker of a group of 2 or more"));
  }
  // A step holds a slot per worker: a group size from the wire is bounded before any is
  // made (a fuzzed one of 2^31 took the process out of memory).
  if (member.workers > kMaxWorkers) {
    return absl::InvalidArgumentError(absl::StrCat("job '", member.job, "': ", member.workers,
                                                   " workers, more than the ", kMaxWorkers,
                                                   " a synchronous step may have"));
  }
  const Key key{member.job, step};
  bool last = false;
  std::shared_ptr<Step> s;
  {
    absl::MutexLock lock(&mu_);
    TESSERA_ASSIGN_OR_RETURN(s, Join(key, member, part, &last));
  }
  if (last) {
    // Outside the lock: the others wait on `done`, their parts stay valid until then.
    Merged merged;
    Merge(s->parts, &merged);
    absl::StatusOr<std::vector<int64_t>> rows = apply(merged.parts, s->parts[0]->request_id);
    absl::MutexLock lock(&mu_);
    s->status = rows.status();
    if (rows.ok()) s->rows = *std::move(rows);
    s->tables = std::move(merged.names);
    s->done = true;
  } else {
    absl::MutexLock lock(&mu_);
    TESSERA_RETURN_IF_ERROR(AwaitStep(key, s, member, part));
  }
  absl::MutexLock lock(&mu_);
  if (!s->status.ok()) return s->status;
  std::vector<int64_t> mine;
  for (const embedding::TableGradients& t : part.tables) {
    auto it = std::find(s->tables.begin(), s->tables.end(), t.table);
    const size_t at = static_cast<size_t>(it - s->tables.begin());
    mine.push_back(at < s->rows.size() ? s->rows[at] : 0);
  }
  return mine;
}

absl::StatusOr<std::shared_ptr<StepAggregator::Step>> StepAggregator::Join(
    const Key& key, const embedding::PushSync& member, const Contribution& part, bool* last) {
  std::shared_ptr<Step>& slot = steps_[key];
  if (slot == nullptr) {
    slot = std::make_shared<Step>();
    slot->workers = member.workers;
    slot->parts.assign(member.workers, nullptr);
  }
  std::shared_ptr<Step> s = slot;
  if (s->workers != member.workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("job '", member.job, "' step ", key.second, ": worker ", member.worker,
                     " says ", member.workers, " workers, others said ", s->workers));
  }
  if (s->done) return s;  // (a step leaves steps_ when its last worker arrives)
  const bool new_worker = s->parts[member.worker] == nullptr;
  *last = s->arrived + (new_worker ? 1 : 0) == s->workers;
  if (!*last && waiting_ >= max_waiting_) {
    if (s->arrived == 0) steps_.erase(key);
    return absl::ResourceExhaustedError(
        absl::StrCat(where_, ": ", waiting_,
                     " pushes of data-parallel jobs wait for their other workers "
                     "already (--max_sync_waiting); job '",
                     member.job, "' step ", key.second,
                     " is refused, retry it once those steps are applied or have timed out"));
  }
  if (new_worker) ++s->arrived;
  s->parts[member.worker] = &part;  // a repeat of a worker's push replaces it
  if (*last) steps_.erase(key);     // a later push of this step starts a new one
  return s;
}

absl::Status StepAggregator::AwaitStep(const Key& key, const std::shared_ptr<Step>& s,
                                       const embedding::PushSync& member,
                                       const Contribution& part) {
  struct AllIn {
    const Step* s;
    bool operator()() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return s->done || s->arrived == s->workers;
    }
  } all_in{s.get()};
  ++waiting_;
  const bool in = mu_.AwaitWithTimeout(absl::Condition(&all_in), absl::FromChrono(member.timeout));
  --waiting_;
  if (in) {
    // Everyone is in: the last one is applying the step, however long that takes.
    mu_.Await(absl::Condition(&s->done));
    return absl::OkStatus();
  }
  std::vector<int> missing;
  for (int w = 0; w < s->workers; ++w) {
    if (s->parts[w] == nullptr) missing.push_back(w);
  }
  // Gone from the step: a retry of this push arrives as new.
  if (s->parts[member.worker] == &part) {
    s->parts[member.worker] = nullptr;
    --s->arrived;
  }
  if (s->arrived == 0) {
    auto it = steps_.find(key);
    if (it != steps_.end() && it->second == s) steps_.erase(it);
  }
  return absl::AbortedError(absl::StrCat(
      "job '", member.job, "' step ", key.second, ": worker(s) ", absl::StrJoin(missing, ", "),
      " of ", s->workers, " did not push to ", where_, " within ", member.timeout.count(),
      " ms (stopped, or slower than the timeout)"));
}

int StepAggregator::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_;
}

size_t StepAggregator::pending() const {
  absl::MutexLock lock(&mu_);
  return steps_.size();
}

}  // namespace tessera::server
