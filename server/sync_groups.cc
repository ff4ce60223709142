#include "server/sync_groups.h"

#include "absl/strings/str_cat.h"

namespace tessera::server {

absl::Status SyncGroups::Register(const std::string& job, int workers) {
  if (job.empty() || job.size() > 256) {
    return absl::InvalidArgumentError("sync group: job must be 1-256 bytes");
  }
  if (workers < 2 || workers > kMaxWorkers) {
    return absl::InvalidArgumentError(absl::StrCat("sync group of job '", job, "': ", workers,
                                                   " workers; a group has 2 to ", kMaxWorkers));
  }
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(job);
  if (it == groups_.end() && groups_.size() >= capacity_) {
    auto oldest = groups_.begin();
    for (auto g = groups_.begin(); g != groups_.end(); ++g) {
      if (g->second.used < oldest->second.used) oldest = g;
    }
    groups_.erase(oldest);
  }
  groups_[job] = Group{workers, ++tick_};
  return absl::OkStatus();
}

absl::Status SyncGroups::Check(const std::string& job, int workers) {
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(job);
  if (it == groups_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job, "' registered no sync group with ", where_,
                     ": a data-parallel job registers its group (RegisterSyncGroup) before its "
                     "first push in it; the client libraries do, and again when told this"));
  }
  if (it->second.workers != workers) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job, "' registered a sync group of ", it->second.workers, " workers with ", where_,
        ", not ", workers, ": register it again with the count its pushes send"));
  }
  it->second.used = ++tick_;
  return absl::OkStatus();
}

size_t SyncGroups::size() const {
  absl::MutexLock lock(&mu_);
  return groups_.size();
}

}  // namespace tessera::server
