#ifndef TESSERA_BASE_ZIPF_SAMPLER_H_
#define TESSERA_BASE_ZIPF_SAMPLER_H_

#include <cmath>
#include <cstdint>
#include <random>

namespace tessera::base {

// Zipf(s) ranks in [1, n] by rejection-inversion (Hörmann and Derflinger), in O(1) memory
// whatever n, so tables of billions of rows can be sampled: the id distribution of every
// benchmark. (The trainer's synthetic data draws from a table of its cardinalities' CDF
// instead: those tables are small, and that sampler defines the default run's data.)
class ZipfSampler {
 public:
  ZipfSampler(int64_t n, double s) : n_(n), s_(s) {
    h_x1_ = HIntegral(1.5) - 1.0;
    h_n_ = HIntegral(static_cast<double>(n) + 0.5);
    threshold_ = 2.0 - HIntegralInverse(HIntegral(2.5) - H(2.0));
  }

  template <typename Rng>
  int64_t operator()(Rng& rng) const {
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    while (true) {
      const double u = h_n_ + unit(rng) * (h_x1_ - h_n_);
      const double x = HIntegralInverse(u);
      int64_t k = static_cast<int64_t>(x + 0.5);
      if (k < 1) k = 1;
      if (k > n_) k = n_;
      if (k - x <= threshold_ || u >= HIntegral(k + 0.5) - H(static_cast<double>(k))) return k;
    }
  }

 private:
  static double Helper1(double x) {  // log1p(x) / x
    return std::abs(x) > 1e-8 ? std::log1p(x) / x : 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
  }
  static double Helper2(double x) {  // expm1(x) / x
    return std::abs(x) > 1e-8 ? std::expm1(x) / x
                              : 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x));
  }
  double H(double x) const { return std::exp(-s_ * std::log(x)); }
  double HIntegral(double x) const {
    const double log_x = std::log(x);
    return Helper2((1.0 - s_) * log_x) * log_x;
  }
  double HIntegralInverse(double x) const {
    double t = x * (1.0 - s_);
    if (t < -1.0) t = -1.0;
    return std::exp(Helper1(t) * x);
  }

  int64_t n_;
  double s_;
  double h_x1_, h_n_, threshold_;
};

}  // namespace tessera::base

#endif  // TESSERA_BASE_ZIPF_SAMPLER_H_
