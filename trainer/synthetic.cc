#include "trainer/synthetic.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "embedding/sharding.h"

namespace tessera::trainer {
namespace {

using embedding::Mix64;

uint64_t Key(uint64_t seed, uint64_t a, uint64_t b = 0) {
  return Mix64(Mix64(seed ^ 0x243f6a8885a308d3ULL) ^ Mix64(a + 0x13198a2e03707344ULL) ^ b);
}

}  // namespace

std::vector<int64_t> DefaultCardinalities(int num_sparse) {
  static constexpr int64_t kCycle[] = {10, 2000, 40, 500, 100, 1000, 20, 200};
  std::vector<int64_t> c(num_sparse);
  for (int f = 0; f < num_sparse; ++f) c[f] = kCycle[f % 8];
  return c;
}

absl::StatusOr<std::unique_ptr<SyntheticGenerator>> SyntheticGenerator::Create(
    const SyntheticConfig& config) {
  if (config.num_dense <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic data needs num_dense > 0, got ", config.num_dense));
  }
  for (size_t f = 0; f < config.cardinalities.size(); ++f) {
    if (config.cardinalities[f] <= 0 || config.cardinalities[f] > (int64_t{1} << 26)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cardinality of feature ", f, " must be in [1, 2^26], got ", config.cardinalities[f]));
    }
  }
  if (!(config.zipf_s >= 0.0) || config.teacher_dim <= 0) {
    return absl::InvalidArgumentError("synthetic data needs zipf_s >= 0 and teacher_dim > 0");
  }
  return std::unique_ptr<SyntheticGenerator>(new SyntheticGenerator(config));
}

SyntheticGenerator::SyntheticGenerator(const SyntheticConfig& config) : config_(config) {
  std::mt19937_64 rng(Key(config.seed, 0xdead));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  dense_w_.resize(config.num_dense);
  for (float& w : dense_w_) w = normal(rng) * config.dense_scale;
  const int k = config.teacher_dim;
  const int nf = num_sparse();
  cdf_.resize(nf);
  effect_.resize(nf);
  latent_.resize(nf);
  for (int f = 0; f < nf; ++f) {
    const int64_t card = config.cardinalities[f];
    cdf_[f].resize(card);
    double total = 0.0;
    for (int64_t r = 0; r < card; ++r) {
      total += std::pow(static_cast<double>(r + 1), -config.zipf_s);
      cdf_[f][r] = total;
    }
    for (double& c : cdf_[f]) c /= total;
    std::mt19937_64 frng(Key(config.seed, 0xfeed, f));
    effect_[f].resize(card);
    latent_[f].resize(card * k);
    for (float& a : effect_[f]) a = normal(frng) * config.id_effect_scale;
    for (float& u : latent_[f]) u = normal(frng);
  }
}

int64_t SyntheticGenerator::IdOf(int feature, int64_t rank) const {
  return static_cast<int64_t>(Key(config_.seed, 0x1d5 + feature, static_cast<uint64_t>(rank)));
}

float SyntheticGenerator::TeacherProbability(const float* dense,
                                             const std::vector<int64_t>& ranks) const {
  double logit = config_.bias;
  for (int j = 0; j < config_.num_dense; ++j) logit += dense_w_[j] * dense[j];
  const int k = config_.teacher_dim;
  const int nf = num_sparse();
  for (int f = 0; f < nf; ++f) logit += effect_[f][ranks[f]];
  double inter = 0.0;
  for (int f = 0; f + 1 < nf; f += 2) {
    const float* u = &latent_[f][ranks[f] * k];
    const float* v = &latent_[f + 1][ranks[f + 1] * k];
    for (int i = 0; i < k; ++i) inter += u[i] * v[i];
  }
  logit += config_.interaction_scale / std::sqrt(static_cast<double>(k)) * inter;
  return static_cast<float>(1.0 / (1.0 + std::exp(-logit)));
}

void SyntheticGenerator::MakeBatch(int64_t index, int size, Batch* batch) const {
  const int nf = num_sparse();
  batch->Reset(nf);
  batch->index = index;
  batch->size = size;
  batch->dense.resize(static_cast<size_t>(size) * config_.num_dense);
  batch->labels.resize(size);
  batch->teacher_probability.resize(size);
  for (int f = 0; f < nf; ++f) {
    batch->ids[f].resize(size);
    batch->offsets[f].resize(size + 1);
    for (int b = 0; b <= size; ++b) batch->offsets[f][b] = b;
  }
  std::mt19937_64 rng(Key(config_.seed, 0xba7c, static_cast<uint64_t>(index)));
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<int64_t> ranks(nf);
  for (int b = 0; b < size; ++b) {
    float* x = &batch->dense[static_cast<size_t>(b) * config_.num_dense];
    for (int j = 0; j < config_.num_dense; ++j) x[j] = static_cast<float>(3.0 * unit(rng));
    for (int f = 0; f < nf; ++f) {
      const auto& cdf = cdf_[f];
      const double u = unit(rng);
      const int64_t r = std::min<int64_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin(),
                                          static_cast<int64_t>(cdf.size()) - 1);
      ranks[f] = r;
      batch->ids[f][b] = IdOf(f, r);
    }
    const float p = TeacherProbability(x, ranks);
    batch->teacher_probability[b] = p;
    batch->labels[b] = unit(rng) < p ? 1.0f : 0.0f;
  }
}

Batch SyntheticGenerator::MakeHeldOut(int64_t samples) const {
  constexpr int kChunk = 4096;
  Batch all;
  all.Reset(num_sparse());
  Batch part;
  for (int64_t done = 0, i = 0; done < samples; ++i) {
    const int n = static_cast<int>(std::min<int64_t>(kChunk, samples - done));
    MakeBatch(kHeldOutIndexBit | i, n, &part);
    all.AppendRange(part, 0, n);
    done += n;
  }
  return all;
}

}  // namespace tessera::trainer
