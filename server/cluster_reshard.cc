// Cluster's live reshard: the coordinator's side of COPY rounds, FREEZE, COMMIT and ABORT
// (the shard's side is ReshardParticipant), and the checks of the new map's shards.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "embedding/batch_ops.h"
#include "embedding/embedding_table.h"
#include "embedding/table_config.h"
#include "server/cluster.h"
#include "wire/row_chunk.h"

namespace tessera::server {

absl::StatusOr<ReshardOutcome> Cluster::Reshard(const std::vector<std::string>& shards) {
  const auto start = std::chrono::steady_clock::now();
  if (shards.empty()) return absl::InvalidArgumentError("reshard: name at least one shard");
  if (std::set<std::string>(shards.begin(), shards.end()).size() != shards.size() ||
      std::count(shards.begin(), shards.end(), "") > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("reshard: the shards must be distinct host:port addresses, got ",
                     absl::StrJoin(shards, ",")));
  }
  absl::MutexLock create(&create_mu_);
  ReshardOutcome out;
  if (shards == live()->addresses()) {
    // The map served now: finish a reshard whose old shards did not all commit.
    if (unfinished_ != nullptr) {
      absl::MutexLock barrier(&barrier_mu_);
      TESSERA_RETURN_IF_ERROR(CommitOldShards(*unfinished_));
      unfinished_.reset();
    }
    out.version = version_.load();
    return out;
  }
  if (unfinished_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("the reshard to version ", version_.load(),
                                                      " is not finished: repeat it first "
                                                      "(tessera-cli reshard --shards=",
                                                      absl::StrJoin(live()->addresses(), ","),
                                                      ")"));
  }
  const uint64_t version = version_.load() + 1;
  client::RouterOptions options = live()->options();
  options.shard_map_version = version;
  auto next = std::make_unique<client::ShardRouter>(shards, options);
  auto u = std::make_unique<UnfinishedReshard>();
  TESSERA_RETURN_IF_ERROR(PrepareReshard(next.get(), u.get(), &out));
  if (options_.pause) options_.pause("reshard: copied");
  // From the freeze on, pushes routed here wait at the barrier (the old shards hold back
  // those of smart clients), then go to the new map.
  absl::MutexLock barrier(&barrier_mu_);
  TESSERA_RETURN_IF_ERROR(FreezeAndCatchUp(next.get(), u.get(), &out));
  // Published: clients that refresh their map (and this coordinator) use the new one.
  // Requests they send the old shards wait there until those commit.
  client::ShardRouter* old = live();
  old->SetReadmitCallback(nullptr);
  old->SetRestartCallback(nullptr);
  WatchShards(next.get());
  router_.store(next.get());
  routers_.push_back(std::move(next));
  SetShardMapVersion(version);
  if (store_ != nullptr) {
    absl::ReaderMutexLock lock(&mu_);
    if (absl::Status saved = store_->Save(StateLocked()); !saved.ok()) {
      std::fprintf(stderr, "tessera: shard map version %llu is not recorded: %s\n",
                   static_cast<unsigned long long>(version), saved.ToString().c_str());
    }
  }
  if (absl::Status s = CommitOldShards(*u); !s.ok()) {
    unfinished_ = std::move(u);
    return s;
  }
  out.version = version;
  const auto end = std::chrono::steady_clock::now();
  out.seconds = std::chrono::duration<double>(end - start).count();
  out.frozen_seconds = std::chrono::duration<double>(frozen_until_ - out.frozen_at).count();
  std::fprintf(stderr,
               "tessera: resharded to %zu shards (map version %llu): %lld rows moved in %.1f s, "
               "%lld then %lld copied again (the second while pushes waited %.2f s)\n",
               shards.size(), static_cast<unsigned long long>(version),
               static_cast<long long>(out.rows_moved), out.seconds,
               static_cast<long long>(out.rows_caught_up),
               static_cast<long long>(out.rows_copied_again), out.frozen_seconds);
  return out;
}

void Cluster::PlaceShards(const client::ShardRouter& old, const client::ShardRouter& next,
                          UnfinishedReshard* u) {
  const std::vector<std::string>& to = next.addresses();
  for (const std::string& a : old.addresses()) {
    auto it = std::find(to.begin(), to.end(), a);
    u->new_index.push_back(it == to.end() ? -1 : static_cast<int32_t>(it - to.begin()));
  }
  for (int32_t k = 0; k < next.num_shards(); ++k) {
    if (std::find(u->new_index.begin(), u->new_index.end(), k) == u->new_index.end()) {
      u->only_new.push_back(k);
    }
  }
}

namespace {

// "reshard not started: shard K of the new map (ADDRESS)": how a failure of a shard that
// joins the map is named.
std::string NewShardNamed(const client::ShardRouter& next, int k) {
  return absl::StrCat("reshard not started: shard ", k, " of the new map (", next.addresses()[k],
                      ")");
}

// How a shard that joins the map must run.
std::string NewShardFlags(const client::ShardRouter& next, int k) {
  return absl::StrCat("start it empty with --shard_index=", k, " --num_shards=", next.num_shards(),
                      " --shard_map_version=", next.options().shard_map_version);
}

}  // namespace

absl::Status Cluster::ProvisionNewMap(client::ShardRouter* next,
                                      const std::vector<v1::TableConfig>& configs,
                                      const UnfinishedReshard& u) {
  // A shard new to the map starts empty: what an earlier attempt that was given up copied
  // there goes (a table dropped since would come back with it).
  for (const int32_t k : u.only_new) TESSERA_RETURN_IF_ERROR(EmptyNewShard(next, k));
  // Every shard of the new map holds every table (shards of both maps have them).
  for (int k = 0; k < next->num_shards(); ++k) {
    for (const v1::TableConfig& config : configs) {
      TESSERA_RETURN_IF_ERROR(
          Annotate(next->CreateTableOn(k, config),
                   absl::StrCat(NewShardNamed(*next, k), ": ", NewShardFlags(*next, k))));
    }
  }
  return absl::OkStatus();
}

absl::Status Cluster::StartCopyOnNewShard(client::ShardRouter* next, int k,
                                          const v1::ReshardRequest& copy) {
  absl::StatusOr<v1::ReshardResponse> r = next->ReshardOn(k, copy);
  TESSERA_RETURN_IF_ERROR(Annotate(r.status(), NewShardNamed(*next, k)));
  if (r->version() == copy.version()) return absl::OkStatus();
  // Started for another map: it would refuse every request of this one for good.
  v1::ReshardRequest abort = copy;
  abort.set_phase(v1::ReshardRequest::ABORT);
  (void)next->ReshardOn(k, abort);
  return absl::FailedPreconditionError(
      absl::StrCat(NewShardNamed(*next, k), " serves shard map version ", r->version(), ", not ",
                   copy.version(), "; ", NewShardFlags(*next, k)));
}

absl::Status Cluster::EmptyNewShard(client::ShardRouter* next, int k) {
  const std::string which = NewShardNamed(*next, k);
  absl::StatusOr<std::vector<v1::TableConfig>> held = next->ListTablesOn(k);
  TESSERA_RETURN_IF_ERROR(Annotate(held.status(), which));
  for (const v1::TableConfig& table : *held) {
    TESSERA_RETURN_IF_ERROR(Annotate(next->DropTableOn(k, table.name()), which));
  }
  return absl::OkStatus();
}

absl::Status Cluster::CheckShardPlaces() {
  client::ShardRouter* map = live();
  const int n = map->num_shards();
  const uint64_t version = version_.load();
  const std::string flags = absl::StrCat("--shards=", absl::StrJoin(map->addresses(), ","),
                                         " --shard_map_version=", version);
  for (int k = 0; k < n; ++k) {
    v1::ReshardRequest settle;
    settle.set_phase(v1::ReshardRequest::SETTLE);
    settle.set_version(version);
    settle.set_shard_index(k);
    settle.set_num_shards(n);
    absl::StatusOr<v1::ReshardResponse> r = map->ReshardOn(k, settle);
    if (!r.ok()) continue;
    const std::string shard = absl::StrCat("shard ", k, " (", map->addresses()[k], ")");
    if (r->version() > version) {
      return absl::FailedPreconditionError(absl::StrCat(
          shard, " serves shard map version ", r->version(), ", newer than this coordinator's ",
          flags, "; start it with that map's version and shards"));
    }
    if (r->version() == version && (r->shard_index() != k || r->num_shards() != n)) {
      return absl::FailedPreconditionError(absl::StrCat(
          shard, " serves place ", r->shard_index(), " of ", r->num_shards(),
          " at shard map version ", version, ", but ", flags, " makes it ", k, " of ", n,
          ": list the shards in their map's order and number (tessera-cli shardmap on the "
          "coordinator that served them), or start each shard with its place in this map"));
    }
  }
  return absl::OkStatus();
}

absl::Status Cluster::PrepareReshard(client::ShardRouter* next, UnfinishedReshard* u,
                                     ReshardOutcome* out) {
  client::ShardRouter* old = live();
  const std::vector<std::string>& to = next->addresses();
  const int m = next->num_shards();
  const std::vector<v1::TableConfig> configs = Tables();
  PlaceShards(*old, *next, u);
  TESSERA_RETURN_IF_ERROR(ProvisionNewMap(next, configs, *u));
  u->old = old;
  u->commit.set_phase(v1::ReshardRequest::COMMIT);
  u->commit.set_version(next->options().shard_map_version);
  u->commit.set_num_shards(m);
  for (const v1::TableConfig& config : configs) {
    if (config.max_rows() > 0)
      (*u->commit.mutable_row_budgets())[config.name()] = config.max_rows();
  }
  // The copy, while the old shards serve on (noting the rows that pushes change). Shards
  // only in the new map lift their row budgets for it too.
  v1::ReshardRequest phase = u->commit;
  phase.set_phase(v1::ReshardRequest::COPY);
  for (const int32_t k : u->only_new) {
    phase.set_shard_index(k);
    TESSERA_RETURN_IF_ERROR(StartCopyOnNewShard(next, k, phase));
  }
  for (int j = 0; j < old->num_shards(); ++j) {
    phase.set_shard_index(u->new_index[j]);
    if (absl::Status s = old->ReshardOn(j, phase).status(); !s.ok()) {
      AbortReshard(*u, j + 1);
      return Annotate(s, "reshard aborted: a shard could not start the copy");
    }
  }
  TESSERA_RETURN_IF_ERROR(
      MoveRows(next, configs, *u, std::vector<int64_t>(old->num_shards(), -1), &out->rows_moved));
  // One catch-up round, still serving: the rows updated during the copy. (Those updated
  // during this round are copied again while frozen.)
  std::vector<int64_t> changed(old->num_shards(), -1);
  for (int j = 0; j < old->num_shards(); ++j) {
    phase.set_shard_index(u->new_index[j]);
    absl::StatusOr<v1::ReshardResponse> r = old->ReshardOn(j, phase);
    if (!r.ok()) {
      AbortReshard(*u, old->num_shards());
      return Annotate(r.status(), "reshard aborted: a shard could not start the catch-up");
    }
    changed[j] = r->changed_rows();
  }
  TESSERA_RETURN_IF_ERROR(MoveRows(next, configs, *u, changed, &out->rows_caught_up));
  // Shards only in the new map write what they received, before pushes wait.
  for (const int32_t k : u->only_new) {
    phase.set_shard_index(k);
    if (absl::Status s = next->ReshardOn(k, phase).status(); !s.ok()) {
      AbortReshard(*u, old->num_shards());
      return Annotate(s, absl::StrCat("reshard aborted: shard ", k, " of the new map (", to[k],
                                      ") could not write the rows it received"));
    }
  }
  return absl::OkStatus();
}

absl::Status Cluster::FreezeAndCatchUp(client::ShardRouter* next, UnfinishedReshard* u,
                                       ReshardOutcome* out) {
  client::ShardRouter* old = u->old;
  const std::vector<v1::TableConfig> configs = Tables();
  std::vector<int64_t> changed(old->num_shards(), -1);
  v1::ReshardRequest phase = u->commit;
  // Frozen: the pushes applied since the copy began re-copy the rows they changed.
  out->frozen_at = std::chrono::steady_clock::now();
  phase.set_phase(v1::ReshardRequest::FREEZE);
  for (int j = 0; j < old->num_shards(); ++j) {
    phase.set_shard_index(u->new_index[j]);
    absl::StatusOr<v1::ReshardResponse> r = old->ReshardOn(j, phase);
    if (!r.ok()) {
      AbortReshard(*u, old->num_shards());  // shard j too: it may have frozen and lost its answer
      return Annotate(r.status(), "reshard aborted: a shard could not freeze");
    }
    for (const v1::AppliedPush& p : r->applied()) *u->commit.add_applied() = p;
    changed[j] = r->changed_rows();
  }
  out->pushes_kept = u->commit.applied_size();
  TESSERA_RETURN_IF_ERROR(MoveRows(next, configs, *u, changed, &out->rows_copied_again));
  // Shards only in the new map learn the applied pushes before any request reaches them.
  for (const int32_t k : u->only_new) {
    v1::ReshardRequest commit = u->commit;
    commit.set_shard_index(k);
    if (absl::Status s = next->ReshardOn(k, commit).status(); !s.ok()) {
      AbortReshard(*u, old->num_shards());
      return Annotate(s, "reshard aborted: a new shard did not take the applied pushes");
    }
  }
  return absl::OkStatus();
}

absl::Status Cluster::MoveRows(client::ShardRouter* next,
                               const std::vector<v1::TableConfig>& configs,
                               const UnfinishedReshard& u, const std::vector<int64_t>& changed,
                               int64_t* moved) {
  client::ShardRouter* old = u.old;
  // Every old shard's rows at once (each one scans its tables).
  std::vector<absl::Status> status(old->num_shards());
  std::vector<int64_t> rows(old->num_shards(), 0);
  auto move = [&](int j) {
    for (const v1::TableConfig& config : configs) {
      v1::ExportRowsRequest request;
      request.set_table(config.name());
      request.set_since_step(-1);
      request.set_with_state(true);
      request.mutable_moving()->set_num_shards(next->num_shards());
      request.mutable_moving()->set_keep_index(u.new_index[j]);
      request.mutable_moving()->set_changed_only(changed[j] >= 0);
      status[j] = old->ExportFrom(j, request, [&](const v1::RowChunk& chunk) -> absl::Status {
        TESSERA_ASSIGN_OR_RETURN(embedding::RowBlock block, wire::FromChunk(chunk));
        TESSERA_RETURN_IF_ERROR(next->ImportRows(config, block));
        rows[j] += static_cast<int64_t>(block.size());
        return absl::OkStatus();
      });
      if (!status[j].ok()) {
        status[j] = Annotate(status[j], absl::StrCat("reshard aborted: rows of table '",
                                                     config.name(), "' did not move"));
        return;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int j = 0; j < old->num_shards(); ++j) {
    if (changed[j] != 0) threads.emplace_back(move, j);  // 0: nothing changed there
  }
  for (std::thread& t : threads) t.join();
  for (int j = 0; j < old->num_shards(); ++j) {
    *moved += rows[j];
    if (!status[j].ok()) {
      AbortReshard(u, old->num_shards());
      return status[j];
    }
  }
  return absl::OkStatus();
}

void Cluster::AbortReshard(const UnfinishedReshard& u, int frozen) {
  v1::ReshardRequest abort = u.commit;
  abort.set_phase(v1::ReshardRequest::ABORT);
  abort.clear_applied();
  for (int j = 0; j < frozen; ++j) {
    abort.set_shard_index(u.new_index[j]);
    if (absl::Status s = u.old->ReshardOn(j, abort).status(); !s.ok()) {
      std::fprintf(stderr, "tessera: shard %d stays frozen for the aborted reshard: %s\n", j,
                   s.ToString().c_str());
    }
  }
}

absl::Status Cluster::CommitOldShards(const UnfinishedReshard& u) {
  // All at once; requests go on at each as it commits.
  std::vector<absl::Status> status(u.old->num_shards());
  auto each = [&](v1::ReshardRequest::Phase phase) {
    std::vector<std::thread> threads;
    for (int j = 0; j < u.old->num_shards(); ++j) {
      if (!status[j].ok()) continue;
      threads.emplace_back([&, j] {
        v1::ReshardRequest request = u.commit;
        request.set_phase(phase);
        request.set_shard_index(u.new_index[j]);
        status[j] = u.old->ReshardOn(j, request).status();
      });
    }
    for (std::thread& t : threads) t.join();
  };
  each(v1::ReshardRequest::COMMIT);
  frozen_until_ = std::chrono::steady_clock::now();
  // Then each has dropped the rows that left it and written those it holds.
  each(v1::ReshardRequest::SETTLE);
  std::vector<std::string> failed;
  for (const absl::Status& s : status) {
    if (!s.ok()) failed.push_back(std::string(s.message()));
  }
  if (failed.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("shard map version ", u.commit.version(), " is published, but ", failed.size(),
                   " old shard(s) did not commit to it (", absl::StrJoin(failed, "; "),
                   "); requests to them wait: repeat the same reshard to finish it"));
}

}  // namespace tessera::server
