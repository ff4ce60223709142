#include "embedding/storage/host_checkpoints.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "embedding/forwarding_collection.h"
#include "embedding/table_config.h"

namespace tessera::storage {
namespace {

using embedding::EmbeddingCollection;

// `config` as the host store holds it.
v1::TableConfig OnHost(v1::TableConfig config) {
  config.set_placement(v1::HOST);
  return config;
}

class HostCheckpointed final : public embedding::ForwardingCollection,
                               public embedding::Checkpointing {
 public:
  HostCheckpointed(std::unique_ptr<EmbeddingCollection> live,
                   std::unique_ptr<DurableCollection> store)
      : ForwardingCollection(live.get()), live_(std::move(live)), store_(std::move(store)) {}

  // A table the store already holds (a run before this one) must have the same config;
  // the live table starts empty either way, and a Restore fills it.
  absl::Status CreateTable(const v1::TableConfig& config) override;
  absl::Status ExportRows(absl::string_view table, const embedding::ExportOptions& options,
                          const std::function<absl::Status(const embedding::RowBlock&)>& sink)
      override {
    return live_->ExportRows(table, options, sink);
  }
  absl::Status ImportRows(absl::string_view table, const embedding::RowBlock& rows) override {
    return live_->ImportRows(table, rows);
  }
  absl::Status DropTable(absl::string_view table) override {
    TESSERA_RETURN_IF_ERROR(live_->DropTable(table));
    return store_->DropTable(table);
  }
  embedding::Checkpointing* checkpointing() override { return this; }
  absl::StatusOr<embedding::CheckpointInfo> Checkpoint(
      int64_t step, const embedding::Attachments& attachments,
      const embedding::CheckpointOptions& options) override;
  absl::StatusOr<embedding::CheckpointInfo> Restore(
      int64_t step, embedding::Attachments* attachments,
      const embedding::RestoreOptions& options) override;
  absl::StatusOr<std::vector<embedding::CheckpointInfo>> ListCheckpoints() const override {
    return store_->ListCheckpoints();
  }

 private:
  // Every row of live table `table` into the store's (with its state and counters).
  absl::Status CopyToStore(const std::string& table);
  // The live table `config` names made afresh from the store's rows.
  absl::Status CopyFromStore(const v1::TableConfig& config);

  std::unique_ptr<EmbeddingCollection> live_;
  std::unique_ptr<DurableCollection> store_;
};

absl::Status HostCheckpointed::CreateTable(const v1::TableConfig& config) {
  const v1::TableConfig host = OnHost(config);
  TESSERA_ASSIGN_OR_RETURN(std::vector<v1::TableConfig> stored, store_->ListTables());
  const auto it = std::find_if(stored.begin(), stored.end(),
                               [&](const v1::TableConfig& t) { return t.name() == host.name(); });
  if (it == stored.end()) {
    TESSERA_RETURN_IF_ERROR(store_->CreateTable(host));
  } else if (const std::vector<std::string> diff = embedding::TableConfigDifferences(*it, host);
             !diff.empty()) {
    return absl::AlreadyExistsError(absl::StrCat("table '", config.name(), "' already exists in ",
                                                 "the checkpoint store with another config: ",
                                                 absl::StrJoin(diff, "; ")));
  }
  return live_->CreateTable(config);
}

absl::Status HostCheckpointed::CopyToStore(const std::string& table) {
  embedding::ExportOptions all;
  all.with_state = true;
  return live_->ExportRows(table, all, [&](const embedding::RowBlock& rows) {
    return store_->ImportRows(table, rows);
  });
}

absl::Status HostCheckpointed::CopyFromStore(const v1::TableConfig& config) {
  TESSERA_RETURN_IF_ERROR(live_->DropTable(config.name()));
  TESSERA_RETURN_IF_ERROR(live_->CreateTable(config));
  embedding::ExportOptions all;
  all.with_state = true;
  return store_->ExportRows(config.name(), all, [&](const embedding::RowBlock& rows) {
    return live_->ImportRows(config.name(), rows);
  });
}

absl::StatusOr<embedding::CheckpointInfo> HostCheckpointed::Checkpoint(
    int64_t step, const embedding::Attachments& attachments,
    const embedding::CheckpointOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<v1::TableConfig> tables, live_->ListTables());
  for (const v1::TableConfig& t : tables) {
    if (!embedding::TableOfModel(t.name(), options.model)) continue;
    TESSERA_RETURN_IF_ERROR(Annotate(CopyToStore(t.name()),
                                     absl::StrCat("copying table '", t.name(), "' to the host")));
  }
  return store_->Checkpoint(step, attachments, options);
}

absl::StatusOr<embedding::CheckpointInfo> HostCheckpointed::Restore(
    int64_t step, embedding::Attachments* attachments, const embedding::RestoreOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(embedding::CheckpointInfo info,
                           store_->Restore(step, attachments, options));
  TESSERA_ASSIGN_OR_RETURN(std::vector<v1::TableConfig> tables, live_->ListTables());
  TESSERA_ASSIGN_OR_RETURN(std::vector<v1::TableConfig> restored, store_->ListTables());
  for (const v1::TableConfig& t : tables) {
    if (!embedding::TableOfModel(t.name(), options.model)) continue;
    // The checkpoint's config (an AlterTable since is undone too), in the live placement.
    v1::TableConfig config = t;
    for (const v1::TableConfig& r : restored) {
      if (r.name() == t.name()) config = r;
    }
    config.set_placement(t.placement());
    TESSERA_RETURN_IF_ERROR(Annotate(CopyFromStore(config),
                                     absl::StrCat("copying table '", t.name(), "' from the host")));
  }
  return info;
}

}  // namespace

std::unique_ptr<EmbeddingCollection> CheckpointThroughHost(
    std::unique_ptr<EmbeddingCollection> live, std::unique_ptr<DurableCollection> store) {
  return std::make_unique<HostCheckpointed>(std::move(live), std::move(store));
}

}  // namespace tessera::storage
