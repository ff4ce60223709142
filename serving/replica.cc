#include "serving/replica.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "client/channel_policy.h"
#include "client/shard_router.h"
#include "embedding/batch_ops.h"
#include "embedding/sharding.h"
#include "serving/internal/replica_shard.h"
#include "trainer/coordinator_rendezvous.h"
#include "trainer/dense_snapshot.h"
#include "wire/row_chunk.h"
#include "wire/security.h"

namespace tessera::serving {

namespace {

constexpr size_t kEventsKept = 64;

bool SameCursor(const v1::ChangeCursor& a, const v1::ChangeCursor& b) {
  return a.log() == b.log() && a.sequence() == b.sequence();
}

}  // namespace

Replica::Replica(const ReplicaOptions& options, std::unique_ptr<client::EmbeddingClient> client)
    : options_(options), client_(std::move(client)) {}

Replica::~Replica() = default;

absl::StatusOr<std::unique_ptr<Replica>> Replica::Start(const std::string& coordinator,
                                                        const ReplicaOptions& options) {
  TESSERA_RETURN_IF_ERROR(embedding::ValidateModelName(options.model));
  for (const std::string& t : options.tables) {
    if (!embedding::TableOfModel(t, options.model)) {
      return absl::InvalidArgumentError(absl::StrCat("table '", t, "' is not of model '",
                                                     options.model, "' (its tables are '",
                                                     options.model, ".<name>')"));
    }
  }
  if (options.max_read_bytes <= 0 || options.max_reads_per_poll <= 0) {
    return absl::InvalidArgumentError("max_read_bytes and max_reads_per_poll must be > 0");
  }
  if (options.checkpoint.has_value() && !options.state_dir.empty()) {
    return absl::InvalidArgumentError(
        "a replica of a checkpoint keeps no state (--state_dir): it reads the checkpoint again "
        "when it starts");
  }
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<client::EmbeddingClient> client,
                           client::EmbeddingClient::Connect(coordinator, options.client));
  std::unique_ptr<Replica> replica(new Replica(options, std::move(client)));
  absl::MutexLock poll(&replica->poll_mu_);
  if (options.checkpoint.has_value()) {
    TESSERA_RETURN_IF_ERROR(replica->LoadCheckpoint(*options.checkpoint));
    return replica;
  }
  replica->LoadState();
  TESSERA_ASSIGN_OR_RETURN(std::vector<v1::TableConfig> listed, replica->client_->ListTables());
  for (const v1::TableConfig& config : listed) {
    if (!replica->Wanted(config.name())) continue;
    TESSERA_RETURN_IF_ERROR(replica->TableFor(config.name()).status());
  }
  TESSERA_RETURN_IF_ERROR(replica->FollowMap());
  // Shards with a saved cursor are read on from it (the next Poll); the others whole.
  for (auto& [address, shard] : replica->shards_) {
    if (shard->cursor.log() != 0) continue;
    TESSERA_RETURN_IF_ERROR(replica->Snapshot(shard.get(), "start"));
  }
  return replica;
}

bool Replica::Wanted(const std::string& table) const {
  if (!embedding::TableOfModel(table, options_.model)) return false;
  return options_.tables.empty() ||
         std::find(options_.tables.begin(), options_.tables.end(), table) != options_.tables.end();
}

absl::Status Replica::FollowMap() {
  TESSERA_ASSIGN_OR_RETURN(v1::ShardMap map, client_->ShardMap());
  if (map.version() == map_version_ && !shards_.empty()) return absl::OkStatus();
  std::map<std::string, std::unique_ptr<Shard>> next;
  for (const v1::ShardInfo& info : map.shards()) {
    auto it = shards_.find(info.address());
    if (it != shards_.end()) {
      it->second->index = info.index();
      next[info.address()] = std::move(it->second);
    } else {
      next[info.address()] = std::make_unique<Shard>(info.index(), info.address(), options_.client);
    }
  }
  {
    absl::MutexLock lock(&mu_);
    shards_ = std::move(next);
  }
  map_version_ = map.version();
  return absl::OkStatus();
}

absl::Status Replica::Poll() {
  absl::MutexLock poll(&poll_mu_);
  const auto began = std::chrono::steady_clock::now();
  if (frozen_step_ >= 0) {  // a checkpoint's: nothing to follow, never behind
    absl::MutexLock lock(&mu_);
    caught_up_at_ = began;
    return absl::OkStatus();
  }
  // The shard map once a second, and after a shard failed (it may have left the map). A
  // coordinator away (restarting) leaves the map as it was: the shards are followed on.
  absl::Status first;
  if (map_stale_ || began - map_read_at_ >= std::chrono::seconds(1)) {
    first = FollowMap();
    if (first.ok()) map_read_at_ = began;
    map_stale_ = !first.ok();
  }
  for (auto& [address, shard] : shards_) {
    absl::Status s = FollowShard(shard.get());
    map_stale_ = map_stale_ || !s.ok();
    if (first.ok() && !s.ok()) first = s;
  }
  bool all = !shards_.empty();
  for (auto& [address, shard] : shards_) all = all && shard->caught_up.load();
  if (all) {
    // Every change made before this Poll began is in the rows now.
    absl::MutexLock lock(&mu_);
    caught_up_at_ = began;
  }
  // The dense weights after the rows: rows newer than the weights rather than older.
  absl::Status dense = FollowDense();
  return first.ok() ? dense : first;
}

absl::Status Replica::FollowDense() {
  const int64_t held = dense_step();
  trainer::CoordinatorRendezvous store(client_.get());
  TESSERA_ASSIGN_OR_RETURN(std::optional<v1::DenseSnapshot> published,
                           trainer::ReadDenseSnapshot(store, options_.model, held));
  if (!published.has_value()) return absl::OkStatus();
  absl::StatusOr<std::shared_ptr<const DenseModel>> model = DenseModel::Make(*published);
  if (!model.ok()) {
    Note(absl::StrCat("dense weights of step ", published->step(),
                      " refused: ", model.status().message()));
    return model.status();
  }
  absl::MutexLock lock(&mu_);
  dense_ = *std::move(model);
  return absl::OkStatus();
}

std::shared_ptr<const DenseModel> Replica::dense() const {
  absl::MutexLock lock(&mu_);
  return dense_;
}

int64_t Replica::dense_step() const {
  absl::MutexLock lock(&mu_);
  return dense_ == nullptr ? -1 : dense_->step();
}

absl::StatusOr<Replica::Prediction> Replica::Predict(int samples, absl::Span<const float> dense,
                                                     absl::Span<const FeatureBags> features) const {
  std::shared_ptr<const DenseModel> model = this->dense();
  if (model == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("model '", options_.model,
                     "' has no dense network published yet (tessera-train --publish_dense_every)"));
  }
  const trainer::DlrmConfig& config = model->config();
  if (samples < 1 || dense.size() != static_cast<size_t>(samples) * config.num_dense) {
    return absl::InvalidArgumentError(absl::StrCat(dense.size(), " dense features for ", samples,
                                                   " samples of ", config.num_dense));
  }
  TESSERA_RETURN_IF_ERROR(embedding::CheckFiniteWeights("dense features", dense));
  std::vector<std::shared_ptr<const embedding::ServingTable>> held;
  std::vector<const embedding::ServingTable*> tables;
  for (const std::string& name : model->tables()) {
    held.push_back(table(name));
    if (held.back() == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("this replica does not serve table '", name, "' (see its --tables)"));
    }
    if (held.back()->dim() != config.emb_dim) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table '", name, "' has dim ", held.back()->dim(), ", the network ", config.emb_dim));
    }
    tables.push_back(held.back().get());
  }
  Prediction out;
  out.serving_step = serving_step();
  out.dense_step = model->step();
  std::vector<float> embeddings(tables.size() * samples * config.emb_dim);
  TESSERA_RETURN_IF_ERROR(PooledEmbeddings(tables, features, samples, absl::MakeSpan(embeddings)));
  out.logits.resize(samples);
  TESSERA_RETURN_IF_ERROR(
      model->Forward(samples, dense.data(), embeddings.data(), out.logits.data()));
  for (float x : out.logits) out.scores.push_back(1.0f / (1.0f + std::exp(-x)));
  return out;
}

absl::Status Replica::FollowShard(Shard* shard) {
  if (shard->cursor.log() == 0) return Snapshot(shard, "a shard new to the replica");
  for (int reads = 0; reads < options_.max_reads_per_poll; ++reads) {
    v1::ReadChangesRequest request;
    *request.mutable_after() = shard->cursor;
    request.set_model(options_.model);
    request.set_max_bytes(options_.max_read_bytes);
    v1::ReadChangesResponse response;
    std::unique_ptr<grpc::ClientContext> context =
        wire::NewCallContext(options_.client.security, options_.client.deadline);
    const grpc::Status status = shard->stub->Get()->ReadChanges(context.get(), request, &response);
    if (status.error_code() == grpc::StatusCode::OUT_OF_RANGE) {
      return Snapshot(shard, status.error_message());
    }
    if (!status.ok()) {
      shard->caught_up = false;
      if (status.error_code() == grpc::StatusCode::UNAVAILABLE) shard->stub->Reset();
      return client::FromShardStatus(status, shard->index, shard->address);
    }
    for (const v1::TableChanges& changes : response.tables()) {
      if (!Wanted(changes.table())) continue;
      TESSERA_RETURN_IF_ERROR(ApplyRows(changes.table(), changes.rows()));
    }
    {
      absl::MutexLock lock(&mu_);
      ++counters_.reads;
      counters_.bytes_read += static_cast<int64_t>(response.ByteSizeLong());
    }
    shard->cursor = response.reached();
    shard->head_step = response.head_step();
    const bool caught_up = SameCursor(response.reached(), response.head());
    int64_t step = shard->step.load();
    for (const v1::TableChanges& changes : response.tables()) {
      step = std::max(step, changes.step());
    }
    shard->step = caught_up ? std::max(step, response.head_step()) : step;
    shard->caught_up = caught_up;
    if (caught_up) return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::Status Replica::Snapshot(Shard* shard, const std::string& why) {
  Note(absl::StrCat("shard ", shard->index, " (", shard->address, ") read whole: ", why));
  shard->caught_up = false;
  // The head first: a row changed while the rows are read is in the log after it.
  v1::ReadChangesRequest head_request;
  head_request.set_model(options_.model);
  v1::ReadChangesResponse head;
  std::unique_ptr<grpc::ClientContext> context =
      wire::NewCallContext(options_.client.security, options_.client.deadline);
  const grpc::Status status = shard->stub->Get()->ReadChanges(context.get(), head_request, &head);
  if (!status.ok()) {
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) shard->stub->Reset();
    return client::FromShardStatus(status, shard->index, shard->address);
  }
  for (const std::string& name : tables()) {
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<embedding::ServingTable> table, TableFor(name));
    if (table == nullptr) continue;
    // Rows the shard owns now: a copy it keeps of a row that moved away is not its to say.
    auto owned_here = [&](int64_t id) {
      return head.num_shards() <= 1 ||
             embedding::ShardOfRow(table->config(), id, head.num_shards()) == head.shard_index();
    };
    v1::ExportRowsRequest request;
    request.set_table(name);
    request.set_since_step(-1);
    std::unique_ptr<grpc::ClientContext> export_context =
        wire::NewCallContext(options_.client.security, options_.client.checkpoint_deadline);
    std::unique_ptr<grpc::ClientReader<v1::RowChunk>> reader =
        shard->stub->Get()->ExportRows(export_context.get(), request);
    absl::flat_hash_set<int64_t> held;
    v1::RowChunk chunk;
    while (reader->Read(&chunk)) {
      TESSERA_ASSIGN_OR_RETURN(embedding::RowBlock rows, wire::FromChunk(chunk));
      embedding::RowBlock owned;
      owned.dim = rows.dim;
      for (size_t i = 0; i < rows.size(); ++i) {
        if (!owned_here(rows.ids[i])) continue;
        owned.Append(rows.ids[i], &rows.weights[i * rows.dim], nullptr, -1, 0);
        held.insert(rows.ids[i]);
      }
      TESSERA_RETURN_IF_ERROR(table->Apply(owned.ids, owned.weights));
      absl::MutexLock lock(&mu_);
      counters_.rows_applied += static_cast<int64_t>(owned.size());
      counters_.bytes_read += static_cast<int64_t>(chunk.ByteSizeLong());
    }
    const grpc::Status finished = reader->Finish();
    if (finished.error_code() == grpc::StatusCode::NOT_FOUND) continue;  // not made there yet
    if (!finished.ok()) return client::FromShardStatus(finished, shard->index, shard->address);
    // Rows of this shard the replica holds but the shard no longer stores (it came back
    // from an older checkpoint): the training side reads them as initial rows again.
    std::vector<int64_t> gone;
    for (const int64_t id : table->Ids()) {
      if (owned_here(id) && !held.contains(id)) gone.push_back(id);
    }
    TESSERA_RETURN_IF_ERROR(table->ResetRows(gone));
  }
  {
    absl::MutexLock lock(&mu_);
    ++counters_.snapshots;
  }
  shard->cursor = head.head();
  shard->step = head.head_step();
  shard->head_step = head.head_step();
  return absl::OkStatus();  // the changes since the head: the next Poll
}

absl::StatusOr<std::shared_ptr<embedding::ServingTable>> Replica::TableFor(
    const std::string& name) {
  if (!Wanted(name)) return std::shared_ptr<embedding::ServingTable>();
  {
    absl::MutexLock lock(&mu_);
    auto it = tables_.find(name);
    if (it != tables_.end()) return it->second;
  }
  // A table made since the replica started: its config from the coordinator.
  TESSERA_ASSIGN_OR_RETURN(std::vector<v1::TableConfig> listed, client_->ListTables());
  for (const v1::TableConfig& config : listed) {
    if (config.name() != name) continue;
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<embedding::ServingTable> made,
                             embedding::ServingTable::Create(config, options_.format));
    std::shared_ptr<embedding::ServingTable> table(std::move(made));
    absl::MutexLock lock(&mu_);
    return tables_.try_emplace(name, std::move(table)).first->second;
  }
  return absl::NotFoundError(
      absl::StrCat("table '", name, "' changed on a shard but the coordinator does not list it"));
}

absl::Status Replica::ApplyRows(const std::string& name, const v1::RowChunk& chunk) {
  if (chunk.ids().empty()) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<embedding::ServingTable> table, TableFor(name));
  if (table == nullptr) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(embedding::RowBlock rows, wire::FromChunk(chunk));
  TESSERA_RETURN_IF_ERROR(table->Apply(rows.ids, rows.weights));
  absl::MutexLock lock(&mu_);
  counters_.rows_applied += static_cast<int64_t>(rows.size());
  return absl::OkStatus();
}

void Replica::Note(const std::string& event) {
  absl::MutexLock lock(&mu_);
  events_.push_back(event);
  if (events_.size() > kEventsKept) events_.erase(events_.begin());
}

std::shared_ptr<const embedding::ServingTable> Replica::table(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = tables_.find(name);
  return it == tables_.end() ? nullptr : it->second;
}

std::vector<std::string> Replica::tables() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> names;
  for (const auto& [name, table] : tables_) names.push_back(name);
  return names;
}

int64_t Replica::NewestHeadStep() const {
  int64_t step = -1;
  for (const auto& [address, shard] : shards_) step = std::max(step, shard->head_step.load());
  return step;
}

int64_t Replica::serving_step() const {
  if (frozen_step_ >= 0) return frozen_step_;
  absl::MutexLock lock(&mu_);
  // A shard read to its head holds back nothing (it applied no push the replica lacks):
  // the newest step any shard applied, less what shards still to be read lack.
  int64_t step = NewestHeadStep();
  for (const auto& [address, shard] : shards_) {
    if (!shard->caught_up.load()) step = std::min(step, shard->step.load());
  }
  return step + 1;  // steps are counted from 0: the pushes of steps 0 .. step are in
}

int64_t Replica::head_step() const {
  if (frozen_step_ >= 0) return frozen_step_;
  absl::MutexLock lock(&mu_);
  return NewestHeadStep() + 1;
}

double Replica::seconds_since_caught_up() const {
  absl::MutexLock lock(&mu_);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - caught_up_at_).count();
}

int Replica::shards_caught_up() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [address, shard] : shards_) n += shard->caught_up.load() ? 1 : 0;
  return n;
}

int Replica::shards() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(shards_.size());
}

ReplicaCounters Replica::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

std::vector<std::string> Replica::events() const {
  absl::MutexLock lock(&mu_);
  return events_;
}

}  // namespace tessera::serving
