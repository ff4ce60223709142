#include "embedding/internal/admission.h"

#include <algorithm>
#include <cmath>

#include "embedding/internal/stripe.h"
#include "embedding/internal/stripe_plan.h"
#include "embedding/sharding.h"

namespace tessera::embedding_internal {
namespace {

constexpr uint64_t kSketchSalt = 0x2f1c5a7be3d09e41ULL;
constexpr uint64_t kCoinSalt = 0x8d3b6e0f47a21c95ULL;

uint64_t MulHi(uint64_t a, uint64_t b) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
}

}  // namespace

std::unique_ptr<AdmissionFilter> AdmissionFilter::Create(const v1::TableConfig& config,
                                                         bool* out_of_memory) {
  *out_of_memory = false;
  const v1::AdmissionConfig& a = config.admission();
  const bool counts = a.min_count() > 1;
  const bool coin = a.probability() > 0.0f && a.probability() < 1.0f;
  if (!counts && !coin) return nullptr;
  int64_t slice = 0;
  AlignedBlock counters;
  if (counts) {
    const int64_t width = a.sketch_width() > 0 ? a.sketch_width() : kDefaultSketchWidth;
    slice = std::max<int64_t>(1, (width + kNumStripes - 1) / kNumStripes);
    counters = AlignedBlock(static_cast<size_t>(slice) * kSketchRows * kNumStripes);
    if (counters.empty()) {
      *out_of_memory = true;
      return nullptr;
    }
  }
  return std::unique_ptr<AdmissionFilter>(new AdmissionFilter(config, std::move(counters), slice));
}

AdmissionFilter::AdmissionFilter(const v1::TableConfig& config, AlignedBlock counters,
                                 int64_t slice)
    : min_count_(std::max(1, config.admission().min_count())),
      seed_(config.seed()),
      counters_(std::move(counters)),
      slice_(slice) {
  const float p = config.admission().probability();
  if (p > 0.0f && p < 1.0f) {
    coin_ = true;
    threshold_ = static_cast<uint64_t>(std::ldexp(static_cast<double>(p), 64));
  }
}

bool AdmissionFilter::Coin(int64_t id) const {
  if (!coin_) return true;
  return embedding::Mix64(embedding::Mix64(static_cast<uint64_t>(id) ^ kCoinSalt) ^ seed_) <
         threshold_;
}

int64_t AdmissionFilter::Slot(uint64_t h, int r) const {
  const int64_t stripe = static_cast<int64_t>(h >> kStripeShift);
  const uint64_t g = embedding::Mix64(h ^ (kSketchSalt * static_cast<uint64_t>(r + 1)));
  return (stripe * kSketchRows + r) * slice_ + static_cast<int64_t>(MulHi(g, slice_));
}

int AdmissionFilter::Estimate(uint64_t h) const {
  const auto* c = static_cast<const uint8_t*>(counters_.data());
  int least = kMaxMinCount;
  for (int r = 0; r < kSketchRows; ++r) least = std::min<int>(least, c[Slot(h, r)]);
  return least;
}

bool AdmissionFilter::Count(int64_t id, uint64_t h) {
  if (!Coin(id)) return false;
  if (min_count_ <= 1) return true;
  auto* c = static_cast<uint8_t*>(counters_.data());
  for (int r = 0; r < kSketchRows; ++r) {
    uint8_t& v = c[Slot(h, r)];
    if (v < kMaxMinCount) ++v;
  }
  return Estimate(h) >= min_count_;
}

bool AdmissionFilter::WouldAdmit(int64_t id, uint64_t h) const {
  if (!Coin(id)) return false;
  return min_count_ <= 1 || Estimate(h) + 1 >= min_count_;
}

}  // namespace tessera::embedding_internal
