#include "serving/dense_model.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/status.h"
#include "embedding/batch_ops.h"
#include "trainer/dense_snapshot.h"

namespace tessera::serving {

DenseModel::DenseModel(const v1::DenseSnapshot& snapshot, trainer::DlrmConfig config)
    : snapshot_(snapshot),
      config_(std::move(config)),
      backends_([this] { return NewBackend(); }, /*max_idle=*/16) {}

absl::StatusOr<std::shared_ptr<const DenseModel>> DenseModel::Make(
    const v1::DenseSnapshot& snapshot) {
  const trainer::DlrmConfig config = trainer::ConfigOf(snapshot);
  TESSERA_RETURN_IF_ERROR(Annotate(trainer::ValidateDlrmConfig(config), "dense snapshot"));
  // One backend now: the shape is checked, and the parameters' count against it.
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<trainer::DenseBackend> probe,
                           trainer::NewCpuDenseBackend(config));
  const size_t floats = probe->Parameters().size();
  if (snapshot.parameters().size() != floats * sizeof(float)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense snapshot of step ", snapshot.step(), ": ", snapshot.parameters().size(),
                     " bytes of parameters, its network takes ", floats * sizeof(float)));
  }
  return std::shared_ptr<const DenseModel>(new DenseModel(snapshot, config));
}

std::unique_ptr<trainer::DenseBackend> DenseModel::NewBackend() const {
  // The shape passed Make: a backend of it is made.
  std::unique_ptr<trainer::DenseBackend> backend =
      std::move(trainer::NewCpuDenseBackend(config_)).value();
  absl::Span<float> params = backend->Parameters();
  const std::string& bytes = snapshot_.parameters();
  TESSERA_DCHECK(params.size() * sizeof(float) == bytes.size());
  std::memcpy(params.data(), bytes.data(), bytes.size());
  return backend;
}

absl::Status DenseModel::Forward(int samples, const float* dense, const float* embeddings,
                                 float* logits) const {
  client::ObjectPool<trainer::DenseBackend>::Lease backend = backends_.Acquire();
  return backend->Forward(samples, dense, embeddings, logits);
}

absl::Status LookupRows(const embedding::ServingTable& table, const embedding::TableBags& bags) {
  if (bags.offsets.empty()) return table.Lookup(bags.ids, bags.out);
  std::vector<int64_t> unique;
  std::vector<int32_t> inverse;
  embedding::Unique(bags.ids, &unique, &inverse);
  std::vector<float> rows(unique.size() * table.dim());
  TESSERA_RETURN_IF_ERROR(table.Lookup(unique, absl::MakeSpan(rows)));
  embedding::PoolBags(rows.data(), table.dim(), inverse, bags.offsets, bags.weights, bags.pooling,
                      bags.out.data());
  return absl::OkStatus();
}

absl::Status PooledEmbeddings(absl::Span<const embedding::ServingTable* const> tables,
                              absl::Span<const FeatureBags> features, int samples,
                              absl::Span<float> out) {
  if (tables.size() != features.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(features.size(), " sparse features for a model of ", tables.size()));
  }
  size_t at = 0;
  for (size_t f = 0; f < tables.size(); ++f) {
    const embedding::ServingTable& table = *tables[f];
    const FeatureBags& bags = features[f];
    const std::string where = absl::StrCat("feature ", f, " (table '", table.config().name(), "')");
    // No offsets: one id a sample (a single-valued feature).
    std::vector<int32_t> one_each;
    absl::Span<const int32_t> offsets = bags.offsets;
    if (offsets.empty()) {
      one_each.resize(bags.ids.size() + 1);
      for (size_t i = 0; i < one_each.size(); ++i) one_each[i] = static_cast<int32_t>(i);
      offsets = one_each;
    }
    TESSERA_ASSIGN_OR_RETURN(size_t n,
                             embedding::CheckLookupShape(where, bags.ids.size(), offsets, {}));
    if (n != static_cast<size_t>(samples)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", n, " bags for ", samples, " samples"));
    }
    const size_t block = static_cast<size_t>(samples) * table.dim();
    if (at + block > out.size()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": no room for its embeddings"));
    }
    embedding::TableBags part;
    part.ids = bags.ids;
    part.offsets = offsets;
    part.out = out.subspan(at, block);
    TESSERA_RETURN_IF_ERROR(LookupRows(table, part));
    at += block;
  }
  return absl::OkStatus();
}

}  // namespace tessera::serving
