#include "server/reshard_participant.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "embedding/embedding_table.h"
#include "embedding/sharding.h"
#include "server/push_applier.h"

namespace tessera::server {

ReshardParticipant::ReshardParticipant(embedding::ShardTables* tables, PushApplier* pushes,
                                       const Options& options)
    : tables_(tables),
      pushes_(pushes),
      on_placement_(options.on_placement),
      version_(options.shard_map_version),
      index_(options.shard_index),
      num_shards_(options.num_shards) {}

ReshardParticipant::~ReshardParticipant() {
  absl::MutexLock lock(&repartition_mu_);
  if (repartition_.joinable()) repartition_.join();
}

absl::Status ReshardParticipant::Enter(Traffic traffic, uint64_t version, absl::Time deadline) {
  // Waits no longer than shortly before the caller gives up, so that it hears why.
  deadline = std::min(deadline - absl::Milliseconds(250), absl::Now() + absl::Minutes(2));
  absl::MutexLock lock(&gate_mu_);
  auto waits = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(gate_mu_) {
    if (committing_) return true;
    if (!frozen_) return false;
    if (traffic == Traffic::kPush) return true;
    return traffic == Traffic::kRead && version != 0 && version == pending_version_;
  };
  while (waits()) {
    if (gate_cv_.WaitWithDeadline(&gate_mu_, deadline) && waits()) {
      return absl::UnavailableError(absl::StrCat("shard ", index_.load(),
                                                 " is moving rows to shard map version ",
                                                 pending_version_, " (a reshard); retry"));
    }
  }
  if (left_) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", index_.load(), " is no longer in the shard map (it left at version ",
                     version_.load(), "); refresh the shard map"));
  }
  ++(traffic == Traffic::kPush ? pushes_in_flight_ : reads_in_flight_);
  return absl::OkStatus();
}

void ReshardParticipant::Leave(Traffic traffic) {
  absl::MutexLock lock(&gate_mu_);
  // Freeze and Commit await the counts with conditions, which the mutex checks itself.
  --(traffic == Traffic::kPush ? pushes_in_flight_ : reads_in_flight_);
}

bool ReshardParticipant::MovingRowsOf(uint64_t version) {
  absl::MutexLock lock(&gate_mu_);
  return version != 0 && version == pending_version_;
}

absl::Status ReshardParticipant::PlaceOfImport(uint64_t* version, int32_t* index,
                                               int32_t* num_shards) {
  absl::MutexLock lock(&gate_mu_);
  if (pending_version_ == 0 || *version == 0 || *version != pending_version_) {
    return absl::OkStatus();
  }
  if (pending_index_ < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", index_.load(), " leaves the map at version ", *version, ": it takes no rows"));
  }
  *version = 0;
  *index = pending_index_;
  *num_shards = pending_shards_;
  return absl::OkStatus();
}

void ReshardParticipant::NoteChanged(const v1::TableConfig& config, absl::Span<const int64_t> ids) {
  // Read after the rows changed: a push that finds it false changed them before COPY set
  // it, so before the copy read them (COPY's store happens before the copy's reads).
  if (!noting_.load()) return;
  int32_t index = 0;
  int32_t shards = 1;
  {
    absl::MutexLock lock(&gate_mu_);
    if (!tracking_) return;
    index = pending_index_;
    shards = pending_shards_;
  }
  absl::MutexLock lock(&changed_mu_);
  absl::flat_hash_set<int64_t>& changed = changed_[config.name()];
  // A fixed vocabulary's rows all move (ExportRows), those this shard keeps too.
  const bool all = config.vocabulary_size() > 0;
  for (const int64_t id : ids) {
    if (all || embedding::ShardOfRow(config, id, shards) != index) changed.insert(id);
  }
}

void ReshardParticipant::NoteCopied(const std::string& table) {
  absl::MutexLock lock(&changed_mu_);
  copied_.insert(table);
}

std::vector<int64_t> ReshardParticipant::ChangedInLastRound(const std::string& table) {
  absl::MutexLock lock(&changed_mu_);
  auto it = to_send_.find(table);
  return it != to_send_.end() ? it->second : std::vector<int64_t>{};
}

int64_t ReshardParticipant::EndRound() {
  absl::MutexLock lock(&changed_mu_);
  int64_t n = 0;
  to_send_.clear();
  for (auto& [table, ids] : changed_) {
    to_send_[table].assign(ids.begin(), ids.end());
    n += static_cast<int64_t>(ids.size());
  }
  changed_.clear();
  return n;
}

absl::Status ReshardParticipant::Handle(const v1::ReshardRequest& request,
                                        v1::ReshardResponse* response) {
  const int32_t m = request.num_shards();
  if (request.version() == 0 || m < 1 || request.shard_index() < -1 || request.shard_index() >= m) {
    return absl::InvalidArgumentError(absl::StrCat("reshard: version ", request.version(),
                                                   ", shard ", request.shard_index(), " of ", m,
                                                   " is not a place in a shard map"));
  }
  // A phase of the next reshard waits until the last one's rows are dropped.
  TESSERA_RETURN_IF_ERROR(FinishRepartition());
  switch (request.phase()) {
    case v1::ReshardRequest::COPY:
      TESSERA_RETURN_IF_ERROR(Copy(request, response));
      break;
    case v1::ReshardRequest::SETTLE:
      break;  // FinishRepartition above
    case v1::ReshardRequest::FREEZE:
      TESSERA_RETURN_IF_ERROR(Freeze(request, response));
      break;
    case v1::ReshardRequest::COMMIT:
      TESSERA_RETURN_IF_ERROR(Commit(request));
      break;
    case v1::ReshardRequest::ABORT:
      TESSERA_RETURN_IF_ERROR(Abort(request));
      break;
    default:
      return absl::InvalidArgumentError(
          "reshard: phase must be COPY, FREEZE, COMMIT, SETTLE or ABORT");
  }
  response->set_version(version_.load());
  response->set_shard_index(index_.load());
  response->set_num_shards(num_shards_.load());
  return absl::OkStatus();
}

absl::Status ReshardParticipant::CheckPending(uint64_t version) const {
  if (pending_version_ == 0 || pending_version_ == version) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("shard ", index_.load(), " is moving to shard map version ", pending_version_,
                   ", not ", version, "; finish or abort that reshard first"));
}

void ReshardParticipant::ClearPending() {
  frozen_ = false;
  tracking_ = false;
  noting_.store(false);
  pending_version_ = 0;
  gate_cv_.SignalAll();
}

absl::Status ReshardParticipant::Copy(const v1::ReshardRequest& request,
                                      v1::ReshardResponse* response) {
  response->set_changed_rows(0);
  // Rows arrive while they move: no budget refuses (or evicts) them until the commit.
  TESSERA_RETURN_IF_ERROR(SplitRowBudgets(
      {request.row_budgets().begin(), request.row_budgets().end()}, /*num_shards=*/0));
  if (version_.load() >= request.version()) {
    // A shard of the new map: the rows that came so far are written now, while the old
    // map serves, and not while pushes wait at the commit.
    if (index_.load() != request.shard_index() || num_shards_.load() != request.num_shards()) {
      return absl::OkStatus();
    }
    return Annotate(tables_->Repartition(request.shard_index(), request.num_shards()),
                    absl::StrCat("shard ", index_.load(), ": the rows moved here"));
  }
  absl::MutexLock lock(&gate_mu_);
  TESSERA_RETURN_IF_ERROR(CheckPending(request.version()));
  // A COPY after the first starts another round: what changed in the last one.
  response->set_changed_rows(tracking_ ? EndRound() : -1);
  if (!tracking_) {
    // The first: what an earlier reshard left is not this one's.
    pushes_->changes().DropHeld();
    TESSERA_RETURN_IF_ERROR(Annotate(
        tables_->DropMovingRows(),
        absl::StrCat("shard ", index_.load(), ": the rows an earlier reshard moved here")));
    absl::MutexLock changed(&changed_mu_);
    copied_.clear();
  }
  tracking_ = true;
  noting_.store(true);
  pending_version_ = request.version();
  pending_index_ = request.shard_index();
  pending_shards_ = request.num_shards();
  return absl::OkStatus();
}

absl::Status ReshardParticipant::Freeze(const v1::ReshardRequest& request,
                                        v1::ReshardResponse* response) {
  const uint64_t serving = version_.load();
  response->set_changed_rows(-1);
  if (serving < request.version()) {
    absl::MutexLock lock(&gate_mu_);
    TESSERA_RETURN_IF_ERROR(CheckPending(request.version()));
    frozen_ = true;
    pending_version_ = request.version();
    pending_index_ = request.shard_index();
    pending_shards_ = request.num_shards();
    // Pushes in flight finish under the map they were checked against.
    gate_mu_.Await(absl::Condition(
        +[](int64_t* n) { return *n == 0; }, &pushes_in_flight_));
    // Every push has noted what it changed before it left.
    if (tracking_) response->set_changed_rows(EndRound());
    // Its own pushes, under its place in the map it serves.
    for (v1::AppliedPush& p : pushes_->OwnPushes(serving, index_.load(), num_shards_.load())) {
      *response->add_applied() = std::move(p);
    }
  } else if (serving > request.version()) {
    return absl::FailedPreconditionError(absl::StrCat("shard ", index_.load(),
                                                      " serves shard map version ", serving,
                                                      ", newer than ", request.version()));
  }
  // Those it kept from earlier reshards (a repeated FREEZE after its COMMIT: only these).
  for (v1::AppliedPush& p : pushes_->Moved()) *response->add_applied() = std::move(p);
  return absl::OkStatus();
}

absl::Status ReshardParticipant::Commit(const v1::ReshardRequest& request) {
  // On disk before the new map is served: a shard restarted after the commit still skips
  // the rows that took a retried push under the old map.
  TESSERA_RETURN_IF_ERROR(pushes_->AddMoved(request.applied()));
  const uint64_t serving = version_.load();
  if (serving == request.version() && index_.load() == request.shard_index() &&
      num_shards_.load() == request.num_shards()) {
    // A shard only in the new map (started on it), or a repeated commit: the rows copied
    // here are written (a CHECKPOINT table's would wait for a checkpoint), those that left
    // dropped.
    absl::Status s = tables_->Repartition(request.shard_index(), request.num_shards());
    if (s.ok()) {
      s = SplitRowBudgets({request.row_budgets().begin(), request.row_budgets().end()},
                          request.num_shards());
    }
    return Annotate(s, absl::StrCat("shard ", index_.load(), ": the rows moved"));
  }
  if (serving >= request.version()) return absl::OkStatus();  // committed already
  TESSERA_RETURN_IF_ERROR(CommitFrozen(request));
  // Serving the new map already: the rows that left are no longer asked for, and go now.
  if (request.shard_index() >= 0) {
    StartRepartition(request.shard_index(), request.num_shards(),
                     {request.row_budgets().begin(), request.row_budgets().end()});
  }
  return absl::OkStatus();
}

absl::Status ReshardParticipant::CommitFrozen(const v1::ReshardRequest& request) {
  absl::MutexLock lock(&gate_mu_);
  if (!frozen_ || pending_version_ != request.version() ||
      pending_index_ != request.shard_index() || pending_shards_ != request.num_shards()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", index_.load(), " was not frozen for shard ", request.shard_index(), " of ",
        request.num_shards(), " at version ", request.version(), "; freeze it first"));
  }
  committing_ = true;
  gate_mu_.Await(absl::Condition(
      +[](ReshardParticipant* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->gate_mu_) {
        return p->reads_in_flight_ == 0 && p->pushes_in_flight_ == 0;
      },
      this));
  absl::Status s = CheckCopied();
  if (s.ok() && on_placement_) {
    s = on_placement_(request.shard_index(), request.num_shards(), request.version());
  }
  // Tables laid out by place serve the new one from here (recorded first: a restart opens
  // the data directory at it, where the moving rows were written).
  if (s.ok() && request.shard_index() >= 0) {
    s = tables_->SwitchPlace(request.shard_index(), request.num_shards());
  }
  if (!s.ok()) {
    committing_ = false;  // still frozen: the coordinator repeats the commit, or aborts
    gate_cv_.SignalAll();
    return Annotate(s, absl::StrCat("shard ", index_.load(), ": reshard not committed"));
  }
  if (request.shard_index() >= 0) {
    index_.store(request.shard_index());
    num_shards_.store(request.num_shards());
  } else {
    left_ = true;
  }
  version_.store(request.version());
  // Its journal speaks of its place in the old map; what it said is moved now.
  pushes_->ClearJournal();
  // The rows that moved here are this shard's to tell replicas of from now on.
  pushes_->changes().Publish();
  committing_ = false;
  ClearPending();
  return absl::OkStatus();
}

absl::Status ReshardParticipant::Abort(const v1::ReshardRequest& request) {
  // The budgets of the map it serves again.
  TESSERA_RETURN_IF_ERROR(SplitRowBudgets(
      {request.row_budgets().begin(), request.row_budgets().end()}, num_shards_.load()));
  absl::MutexLock lock(&gate_mu_);
  if (committing_ || pending_version_ != request.version()) return absl::OkStatus();
  ClearPending();
  pushes_->changes().DropHeld();
  // The rows that came for the next map go (the old owners kept theirs): a shard keeps no
  // copy of a row it does not own. On an error it serves on, and the next reshard's first
  // COPY tries again.
  return Annotate(
      tables_->DropMovingRows(),
      absl::StrCat("shard ", index_.load(), ": the rows moved here for the given-up shard map"));
}

absl::Status ReshardParticipant::CheckCopied() {
  TESSERA_ASSIGN_OR_RETURN(std::vector<v1::TableConfig> tables, tables_->ListTables());
  std::set<std::string> copied;
  {
    absl::MutexLock lock(&changed_mu_);
    copied = copied_;
  }
  for (const v1::TableConfig& t : tables) {
    if (copied.count(t.name()) > 0) continue;
    absl::StatusOr<embedding::TableUsage> usage = tables_->Usage(t.name());
    if (!usage.ok() || usage->rows == 0) continue;  // dropped meanwhile, or nothing to lose
    return absl::FailedPreconditionError(absl::StrCat(
        "table '", t.name(), "' holds ", usage->rows, " rows on shard ", index_.load(),
        " that the reshard did not copy (the coordinator does not know the table): create it "
        "through the coordinator or drop it, then repeat the reshard"));
  }
  return absl::OkStatus();
}

absl::Status ReshardParticipant::SplitRowBudgets(const std::map<std::string, int64_t>& row_budgets,
                                                 int32_t num_shards) {
  for (const auto& [table, whole] : row_budgets) {
    const int64_t part = num_shards > 0 ? (whole + num_shards - 1) / num_shards : 0;
    absl::Status s = tables_->SetRowBudget(table, part);
    if (!s.ok() && !absl::IsNotFound(s)) return s;  // a table dropped meanwhile has none
  }
  return absl::OkStatus();
}

void ReshardParticipant::StartRepartition(int32_t index, int32_t num_shards,
                                          std::map<std::string, int64_t> row_budgets) {
  absl::MutexLock lock(&repartition_mu_);
  if (repartition_.joinable()) repartition_.join();
  repartition_index_ = index;
  repartition_shards_ = num_shards;
  repartition_ = std::thread([this, index, num_shards, budgets = std::move(row_budgets)] {
    absl::Status s = tables_->Repartition(index, num_shards);
    // Then the budgets of the new map (fewer rows to evict down once those that left went).
    if (s.ok()) s = SplitRowBudgets(budgets, num_shards);
    if (!s.ok()) {
      std::fprintf(stderr, "tessera: shard %d: the rows that left it are not all dropped: %s\n",
                   index, s.ToString().c_str());
    }
    repartitioned_ = s;
  });
}

absl::Status ReshardParticipant::FinishRepartition() {
  absl::MutexLock lock(&repartition_mu_);
  if (!repartition_.joinable()) return absl::OkStatus();
  repartition_.join();
  if (repartitioned_.ok()) return absl::OkStatus();
  repartitioned_ = tables_->Repartition(repartition_index_, repartition_shards_);
  return Annotate(repartitioned_, absl::StrCat("shard ", index_.load(),
                                               ": the rows that left it are not all dropped"));
}

}  // namespace tessera::server
