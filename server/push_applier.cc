#include "server/push_applier.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/status.h"
#include "embedding/batch_ops.h"
#include "server/reshard_participant.h"

namespace tessera::server {

namespace {

// A request id already used by a push of another shape: its first answer does not fit.
absl::Status ReusedRequestId(const embedding::RequestId& id, size_t tables) {
  return absl::InvalidArgumentError(
      absl::StrCat("request id ", id.client_id, ":", id.sequence,
                   " was used by an earlier push of another number of tables (or another "
                   "sync group) than this one's ",
                   tables, ": a request id names one push; give each push its own"));
}

}  // namespace

PushApplier::PushApplier(embedding::ShardTables* tables, ReshardParticipant* reshard,
                         ConfigLookup configs, const Options& options)
    : tables_(tables),
      reshard_(reshard),
      configs_(std::move(configs)),
      options_(options),
      journal_(options.push_window),
      moved_(options.push_window * 4),
      groups_(options.where),
      steps_(options.where, options.max_sync_waiting),
      changes_(options.change_log_bytes) {
  // The pushes handed over by reshards before a restart: retries of them still skip the
  // rows that took them.
  absl::StatusOr<std::string> kept = tables_->ServerState(kMovedPushesKey);
  absl::Status s = kept.ok() ? moved_.AddSerialized(*kept) : kept.status();
  if (!s.ok()) {
    std::fprintf(stderr, "tessera: %s: cannot read the pushes of earlier maps: %s\n",
                 options_.where.c_str(), s.ToString().c_str());
  }
}

absl::StatusOr<std::vector<int64_t>> PushApplier::Apply(const DecodedBatch& whole, int64_t step,
                                                        const embedding::RequestId& request) {
  // A push retried across a reshard: the ids whose rows took it under the old map are left
  // out (and counted as updated).
  DecodedBatch kept;
  std::vector<int64_t> skipped;
  const bool filtered = WithoutMovedPushes(whole, request, &kept, &skipped);
  const DecodedBatch& batch = filtered ? kept : whole;
  const uint64_t version = reshard_->version();  // pushes in flight hold off a commit
  const embedding::RequestId id = JournalIdAt(request, version);
  auto table_of = [&](size_t i) { return batch.pushes[i].table; };
  absl::StatusOr<std::vector<int64_t>> result = journal_.Run(
      id, batch.pushes.size(),
      [&](std::vector<int64_t>* done) { return ApplyParts(batch, step, id, version, done); },
      table_of);
  // Applied, in part or whole, or not at all: a reshard's copy sends these rows again.
  for (size_t i = 0; i < batch.pushes.size() && reshard_->noting(); ++i) {
    if (absl::StatusOr<v1::TableConfig> c = ConfigOf(batch, i); c.ok()) {
      reshard_->NoteChanged(*c, batch.pushes[i].ids);
    }
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> updated, std::move(result));
  if (updated.size() != batch.pushes.size()) return ReusedRequestId(request, batch.pushes.size());
  for (size_t i = 0; filtered && i < updated.size() && i < skipped.size(); ++i) {
    updated[i] += skipped[i];
  }
  return updated;
}

absl::Status PushApplier::ApplyParts(const DecodedBatch& batch, int64_t step,
                                     const embedding::RequestId& id, uint64_t version,
                                     std::vector<int64_t>* done) {
  // A collection that applies a batch whole (every part checked first, then every part
  // applied, its tables in parallel) takes it in one call.
  if (done->empty() && tables_->AppliesBatchWhole()) {
    return ApplyWhole(batch, step, embedding::PushTag{id, 0, version}, done);
  }
  // Applied part by part: every part's room is checked before the first applies, so that a
  // budget refusing a later table leaves the earlier ones as they were.
  if (done->empty() && batch.pushes.size() > 1) TESSERA_RETURN_IF_ERROR(Check(batch, step));
  thread_local std::vector<int64_t> unique;
  thread_local std::vector<int32_t> inverse;
  absl::Status partly;
  for (size_t i = done->size(); i < batch.pushes.size(); ++i) {
    const embedding::TableGradients& part = batch.pushes[i];
    const embedding::PushTag tag{id, static_cast<uint32_t>(i), version};
    if (!id.empty()) {
      // Applied and made durable before this shard restarted (write-through tables keep the
      // record with the rows): answered as then, not applied again.
      if (std::optional<int64_t> rows = tables_->RecordedPush(tag); rows.has_value()) {
        done->push_back(*rows);
        continue;
      }
    }
    absl::Status applied =
        id.empty()
            ? tables_->PushGradients(part.table, part.ids, part.gradients, step)
            : tables_->PushGradientsRecorded(part.table, part.ids, part.gradients, step, tag);
    // A part that kept some rows (their results were not finite) has updated the others: it
    // counts as applied, so a repeat does not apply them again.
    TESSERA_RETURN_IF_ERROR(tessera::SetAsidePartlyApplied(std::move(applied), &partly));
    embedding::Unique(part.ids, &unique, &inverse);
    changes_.Append(part.table, step, unique);
    done->push_back(static_cast<int64_t>(unique.size()));
    if (i < batch.counters.size() && batch.counters[i] != nullptr) {
      batch.counters[i]->updates += static_cast<int64_t>(unique.size());
    }
  }
  return partly;
}

absl::Status PushApplier::Check(const DecodedBatch& batch, int64_t step) {
  embedding::PushOptions check;
  check.check_only = true;
  check.checked = batch.checked_pushes();
  return tables_->PushBatch(batch.pushes, step, check);
}

absl::Status PushApplier::ApplyWhole(const DecodedBatch& batch, int64_t step,
                                     const embedding::PushTag& first, std::vector<int64_t>* done) {
  embedding::PushOptions options;
  options.rows_updated = done;
  options.request_id = first.request;  // a collection that records pushes records them
  options.map_version = first.map_version;
  options.checked = batch.checked_pushes();
  absl::Status s = tables_->PushBatch(batch.pushes, step, options);
  // Refused whole (nothing applied, nothing noted), or applied: a part that kept some rows
  // has updated the others, so the push counts as applied and a repeat is not.
  if (!s.ok() && !tessera::IsPartlyApplied(s)) {
    done->clear();
    return s;
  }
  TESSERA_DCHECK(done->size() == batch.pushes.size());
  for (const embedding::TableGradients& part : batch.pushes) {
    changes_.Append(part.table, step, part.ids);
  }
  for (size_t i = 0; i < done->size() && i < batch.counters.size(); ++i) {
    if (batch.counters[i] != nullptr) batch.counters[i]->updates += (*done)[i];
  }
  return s;
}

absl::StatusOr<v1::TableConfig> PushApplier::ConfigOf(const DecodedBatch& batch, size_t i) const {
  if (i < batch.configs.size()) return batch.configs[i];
  TESSERA_ASSIGN_OR_RETURN(ConfigRef config, configs_(batch.pushes[i].table, nullptr));
  return *config;
}

bool PushApplier::WithoutMovedPushes(const DecodedBatch& batch, const embedding::RequestId& id,
                                     DecodedBatch* kept, std::vector<int64_t>* skipped) const {
  if (id.empty() || moved_.empty()) return false;
  const std::vector<v1::AppliedPush> applied = moved_.Of(id);
  if (applied.empty()) return false;
  const size_t n = batch.pushes.size();
  kept->configs = batch.configs;
  kept->config_refs = batch.config_refs;
  kept->counters = batch.counters;
  kept->id_copies.assign(n, {});
  kept->float_copies.assign(n, {});
  skipped->assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const embedding::TableGradients& part = batch.pushes[i];
    const absl::StatusOr<v1::TableConfig> config = ConfigOf(batch, i);
    std::vector<int64_t>& ids = kept->id_copies[i];
    std::vector<float>& gradients = kept->float_copies[i];
    const size_t dim = part.ids.empty() ? 0 : part.gradients.size() / part.ids.size();
    absl::flat_hash_set<int64_t> left_out;
    for (size_t j = 0; j < part.ids.size(); ++j) {
      const int64_t row = part.ids[j];
      // A table unknown here keeps its ids: the push refuses it as it would have.
      const bool done =
          config.ok() && std::any_of(applied.begin(), applied.end(), [&](const v1::AppliedPush& a) {
            return AppliedTo(a, *config, row);
          });
      if (done) {
        left_out.insert(row);
        continue;
      }
      ids.push_back(row);
      gradients.insert(gradients.end(), part.gradients.begin() + j * dim,
                       part.gradients.begin() + (j + 1) * dim);
    }
    (*skipped)[i] = static_cast<int64_t>(left_out.size());
  }
  kept->pushes.clear();
  kept->total_ids = 0;
  for (size_t i = 0; i < n; ++i) {
    kept->pushes.push_back(embedding::TableGradients{batch.pushes[i].table, kept->id_copies[i],
                                                     kept->float_copies[i]});
    kept->total_ids += static_cast<int64_t>(kept->id_copies[i].size());
  }
  return true;
}

void PushApplier::StartSync(embedding::PushSync member, int64_t step,
                            const embedding::RequestId& id, Contribution* part,
                            StepAggregator::Done done) {
  member.timeout = std::min(member.timeout, options_.max_sync_wait);
  if (member.job.empty() || member.job.size() > 256) {
    return done(absl::InvalidArgumentError("sync push: job must be 1-256 bytes"));
  }
  // A group no job registered is refused before it can hold anything.
  if (absl::Status s = groups_.Check(member.job, member.workers); !s.ok()) return done(s);
  // The journal answers a repeat of this worker's push; one more part than the tables
  // marks the contribution made (a worker with no ids here still takes part in the step).
  const size_t parts = part->tables.size();
  const embedding::RequestId journal_id = JournalIdAt(id, reshard_->version());
  PushJournal::Claim claim = journal_.Begin(journal_id);
  if (claim.state == PushJournal::Began::kBusy) {
    return done(absl::UnavailableError(absl::StrCat(
        "job '", member.job, "' step ", step, ": push ", id.client_id, ":", id.sequence,
        " is waiting for the step's other workers already (an earlier attempt); retry it")));
  }
  if (claim.state == PushJournal::Began::kDone) {
    if (claim.done.size() != parts + 1) return done(ReusedRequestId(id, parts));
    claim.done.pop_back();
    return done(std::move(claim.done));
  }
  steps_.Start(
      member, step, part,
      [this, step](absl::Span<const embedding::TableGradients> merged,
                   const embedding::RequestId& first) { return ApplyMerged(merged, step, first); },
      [this, journal_id, done = std::move(done)](absl::StatusOr<std::vector<int64_t>> rows) {
        // The aggregator answers each worker with its own parts' rows: kept with one more
        // entry, the mark of a contribution made.
        std::vector<int64_t> kept;
        if (rows.ok()) {
          kept = *rows;
          kept.push_back(0);
        }
        journal_.End(journal_id, rows.status(), std::move(kept));
        done(std::move(rows));
      });
}

absl::StatusOr<std::vector<int64_t>> PushApplier::ApplyMerged(
    absl::Span<const embedding::TableGradients> merged, int64_t step,
    const embedding::RequestId& first) {
  // Under an id of its own, derived from the first worker's: a retry of the whole step
  // (every worker's push again, after this shard restarted) finds it applied.
  embedding::RequestId id = first;
  if (!id.empty()) id.client_id ^= 0x5a17c0de5a17c0deULL;
  if (id.client_id == 0) id.client_id = 1;
  DecodedBatch batch;
  batch.pushes.assign(merged.begin(), merged.end());
  batch.counters.resize(merged.size());
  for (size_t i = 0; i < merged.size(); ++i) {
    // A table dropped meanwhile has no counters; its part is refused as NotFound below.
    if (!configs_(merged[i].table, &batch.counters[i]).ok()) batch.counters[i] = nullptr;
  }
  return Apply(batch, step, id);
}

std::vector<v1::AppliedPush> PushApplier::OwnPushes(uint64_t version, int32_t index,
                                                    int32_t num_shards) {
  std::vector<v1::AppliedPush> own;
  for (const PushJournal::Applied& a : journal_.AppliedPushes()) {
    v1::AppliedPush& p = own.emplace_back();
    // Journaled under JournalIdAt: the client's id back (the mix is its own inverse).
    const embedding::RequestId client = JournalIdAt(a.id, version);
    p.mutable_request_id()->set_client_id(client.client_id);
    p.mutable_request_id()->set_sequence(client.sequence);
    p.set_owner(index);
    p.set_num_shards(num_shards);
    for (const std::string& t : a.tables) p.add_tables(t);
  }
  // And those on durable record, which a restart took out of its journal.
  for (v1::AppliedPush& p : RecordedUnder(tables_->RecordedPushes(), version, index, num_shards)) {
    own.push_back(std::move(p));
  }
  return own;
}

absl::Status PushApplier::AddMoved(
    const google::protobuf::RepeatedPtrField<v1::AppliedPush>& applied) {
  moved_.Add(applied);
  return KeepMoved();
}

absl::Status PushApplier::ForgetAll() {
  journal_.Clear();
  moved_.Clear();
  return KeepMoved();
}

absl::Status PushApplier::KeepMoved() {
  return Annotate(tables_->KeepServerState(kMovedPushesKey, moved_.Serialized()),
                  absl::StrCat(options_.where, ": the pushes of earlier maps not kept"));
}

}  // namespace tessera::server
