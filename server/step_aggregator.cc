#include "server/step_aggregator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
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

StepAggregator::StepAggregator(std::string where, int max_waiting)
    : where_(std::move(where)), max_waiting_(max_waiting), timer_([this] { TimerLoop(); }) {}

StepAggregator::~StepAggregator() {
  std::vector<Answer> answers;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    timer_cv_.Signal();
    for (auto& [key, s] : steps_) {
      for (Waiter& w : s->parts) {
        if (w.part == nullptr) continue;
        answers.emplace_back(std::move(w.done),
                             absl::UnavailableError(absl::StrCat(where_, " is shutting down")));
      }
    }
    steps_.clear();
    parked_.clear();
    deadlines_.clear();
  }
  timer_.join();
  for (Answer& a : answers) a.first(std::move(a.second));
}

void StepAggregator::Start(const embedding::PushSync& member, int64_t step,
                           const Contribution* part, ApplyFn apply, Done done) {
  if (member.workers < 2 || member.worker < 0 || member.worker >= member.workers) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("job '", member.job, "': worker ", member.worker, " of ", member.workers,
                     " is not a worker of a group of 2 or more")));
  }
  // A step holds a slot per worker: a group size from the wire is bounded before any is
  // made (a fuzzed one of 2^31 took the process out of memory).
  if (member.workers > kMaxWorkers) {
    return done(absl::InvalidArgumentError(absl::StrCat("job '", member.job, "': ", member.workers,
                                                        " workers, more than the ", kMaxWorkers,
                                                        " a synchronous step may have")));
  }
  std::vector<Answer> answers;
  absl::StatusOr<std::shared_ptr<Step>> complete;
  {
    absl::MutexLock lock(&mu_);
    complete = Join(Key{member.job, step}, member, part, &done, &answers);
  }
  for (Answer& a : answers) a.first(std::move(a.second));
  if (!complete.ok()) return done(complete.status());
  if (*complete != nullptr) ApplyStep(*complete, apply);  // else: parked, done moved there
}

void StepAggregator::ApplyStep(const std::shared_ptr<Step>& s, const ApplyFn& apply) {
  std::vector<const Contribution*> parts;
  for (const Waiter& w : s->parts) parts.push_back(w.part);
  // Every part stays valid until its worker is answered below.
  Merged merged;
  Merge(parts, &merged);
  absl::StatusOr<std::vector<int64_t>> rows = apply(merged.parts, parts[0]->request_id);
  for (Waiter& w : s->parts) {
    if (!rows.ok()) {
      w.done(rows.status());
      continue;
    }
    std::vector<int64_t> mine;
    for (const embedding::TableGradients& t : w.part->tables) {
      auto it = std::find(merged.names.begin(), merged.names.end(), t.table);
      const size_t at = static_cast<size_t>(it - merged.names.begin());
      mine.push_back(at < rows->size() ? (*rows)[at] : 0);
    }
    w.done(std::move(mine));
  }
}

absl::StatusOr<std::shared_ptr<StepAggregator::Step>> StepAggregator::Join(
    const Key& key, const embedding::PushSync& member, const Contribution* part, Done* done,
    std::vector<Answer>* answers) {
  std::shared_ptr<Step>& slot = steps_[key];
  if (slot == nullptr) {
    slot = std::make_shared<Step>();
    slot->workers = member.workers;
    slot->parts.resize(member.workers);
  }
  std::shared_ptr<Step> s = slot;
  if (s->workers != member.workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("job '", member.job, "' step ", key.second, ": worker ", member.worker,
                     " says ", member.workers, " workers, others said ", s->workers));
  }
  Waiter& mine = s->parts[member.worker];
  const bool new_worker = mine.part == nullptr;
  const bool last = s->arrived + (new_worker ? 1 : 0) == s->workers;
  if (!last && new_worker && static_cast<int>(parked_.size()) >= max_waiting_) {
    if (s->arrived == 0) steps_.erase(key);
    return absl::ResourceExhaustedError(
        absl::StrCat(where_, ": ", parked_.size(),
                     " pushes of data-parallel jobs wait for their other workers "
                     "already (--max_sync_waiting); job '",
                     member.job, "' step ", key.second,
                     " is refused, retry it once those steps are applied or have timed out"));
  }
  if (!new_worker) {
    // A later push of the same worker and step (a restarted worker's) takes the place of
    // the one waiting, which is answered: its part is not applied.
    Forget(mine);
    answers->emplace_back(std::move(mine.done), absl::AbortedError(absl::StrCat(
                                                    "job '", member.job, "' step ", key.second,
                                                    ": a later push of worker ", member.worker,
                                                    " to ", where_, " took this one's place")));
  } else {
    ++s->arrived;
  }
  mine = Waiter{part, std::move(*done), member.timeout,
                absl::Now() + absl::FromChrono(member.timeout)};
  if (!last) {
    parked_[part] = key;
    const bool earliest = deadlines_.empty() || mine.deadline < deadlines_.begin()->first;
    deadlines_.emplace(mine.deadline, part);
    if (earliest) timer_cv_.Signal();
    return nullptr;
  }
  steps_.erase(key);  // a later push of this step starts a new one
  for (const Waiter& w : s->parts) {
    if (w.part != part) Forget(w);
  }
  return s;
}

void StepAggregator::Forget(const Waiter& w) {
  parked_.erase(w.part);
  for (auto [it, end] = deadlines_.equal_range(w.deadline); it != end; ++it) {
    if (it->second == w.part) {
      deadlines_.erase(it);
      break;
    }
  }
}

void StepAggregator::Unpark(const Contribution* part, bool timed_out,
                            std::vector<Answer>* answers) {
  auto at = parked_.find(part);
  if (at == parked_.end()) return;
  const Key key = at->second;
  auto found = steps_.find(key);
  if (found == steps_.end()) return;  // (not reached: a parked part's step is in steps_)
  const std::shared_ptr<Step> s = found->second;
  std::vector<int> missing;
  int worker = 0;
  for (int w = 0; w < s->workers; ++w) {
    if (s->parts[w].part == nullptr) missing.push_back(w);
    if (s->parts[w].part == part) worker = w;
  }
  Waiter gone = std::move(s->parts[worker]);
  s->parts[worker] = Waiter{};
  Forget(gone);
  // Gone from the step: a retry of this push arrives as new.
  if (--s->arrived == 0) steps_.erase(found);
  absl::Status why =
      timed_out
          ? absl::AbortedError(absl::StrCat(
                "job '", key.first, "' step ", key.second, ": worker(s) ",
                absl::StrJoin(missing, ", "), " of ", s->workers, " did not push to ", where_,
                " within ", gone.timeout.count(), " ms (stopped, or slower than the timeout)"))
          : absl::CancelledError(absl::StrCat(
                "job '", key.first, "' step ", key.second, ": the push of worker ", worker,
                " was cancelled while it waited for worker(s) ", absl::StrJoin(missing, ", ")));
  answers->emplace_back(std::move(gone.done), std::move(why));
}

bool StepAggregator::Cancel(const Contribution* part) {
  std::vector<Answer> answers;
  {
    absl::MutexLock lock(&mu_);
    Unpark(part, /*timed_out=*/false, &answers);
  }
  for (Answer& a : answers) a.first(std::move(a.second));
  return !answers.empty();
}

void StepAggregator::TimerLoop() {
  mu_.Lock();
  while (!stop_) {
    if (deadlines_.empty()) {
      timer_cv_.Wait(&mu_);
      continue;
    }
    if (absl::Now() < deadlines_.begin()->first) {
      timer_cv_.WaitWithDeadline(&mu_, deadlines_.begin()->first);
      continue;
    }
    std::vector<Answer> answers;
    while (!deadlines_.empty() && deadlines_.begin()->first <= absl::Now()) {
      const Contribution* part = deadlines_.begin()->second;
      deadlines_.erase(deadlines_.begin());
      Unpark(part, /*timed_out=*/true, &answers);
    }
    mu_.Unlock();
    for (Answer& a : answers) a.first(std::move(a.second));
    mu_.Lock();
  }
  mu_.Unlock();
}

absl::StatusOr<std::vector<int64_t>> StepAggregator::Contribute(const embedding::PushSync& member,
                                                                int64_t step,
                                                                const Contribution& part,
                                                                const ApplyFn& apply) {
  struct Answered {
    absl::Notification done;
    absl::StatusOr<std::vector<int64_t>> result;
  };
  auto answered = std::make_shared<Answered>();
  Start(member, step, &part, apply, [answered](absl::StatusOr<std::vector<int64_t>> r) {
    const std::shared_ptr<Answered> keep = answered;  // past Notify, whoever returns first
    keep->result = std::move(r);
    keep->done.Notify();
  });
  answered->done.WaitForNotification();
  return std::move(answered->result);
}

int StepAggregator::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(parked_.size());
}

size_t StepAggregator::pending() const {
  absl::MutexLock lock(&mu_);
  return steps_.size();
}

}  // namespace tessera::server
