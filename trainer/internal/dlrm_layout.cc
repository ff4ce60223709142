#include "trainer/internal/dlrm_layout.h"

#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "base/crc32c.h"

namespace tessera::trainer_internal {
namespace {

// The format's name since the CPU backend first wrote it; kept so that older checkpoints
// load.
constexpr absl::string_view kStateMagic = "tessera-dense-cpu 1\n";

}  // namespace

DlrmLayout::DlrmLayout(const trainer::DlrmConfig& config) {
  f1 = config.num_sparse + 1;
  num_pairs = f1 * (f1 - 1) / 2;
  top_in = config.emb_dim + num_pairs;
  size_t at = 0;
  auto pad = [](size_t n) { return (n + 15) / 16 * 16; };
  auto add = [&](std::vector<DenseLayer>& layers, int in, int out, bool relu) {
    DenseLayer l{in, out, at, at + pad(static_cast<size_t>(in) * out), relu};
    at = l.b_at + pad(out);
    layers.push_back(l);
  };
  size_t bottom_layers = 0;
  const std::vector<trainer::DlrmLayerShape> shapes =
      trainer::DlrmLayerShapes(config, &bottom_layers);
  for (size_t i = 0; i < shapes.size(); ++i) {
    add(i < bottom_layers ? bottom : top, shapes[i].in, shapes[i].out, shapes[i].relu);
  }
  num_params = at;
}

std::vector<float> InitialDlrmParameters(const trainer::DlrmConfig& config,
                                         const DlrmLayout& layout) {
  std::vector<float> params(layout.num_params, 0.0f);
  std::mt19937_64 rng(config.seed);
  for (const std::vector<DenseLayer>* layers : {&layout.bottom, &layout.top}) {
    for (const DenseLayer& l : *layers) {
      std::normal_distribution<float> w(0.0f, std::sqrt(2.0f / (l.in + l.out)));
      std::normal_distribution<float> b(0.0f, std::sqrt(1.0f / l.out));
      for (size_t i = 0; i < static_cast<size_t>(l.in) * l.out; ++i) params[l.w_at + i] = w(rng);
      for (int i = 0; i < l.out; ++i) params[l.b_at + i] = b(rng);
    }
  }
  return params;
}

std::string EncodeDenseState(absl::Span<const float> params, absl::Span<const float> m,
                             absl::Span<const float> v, int64_t adam_step) {
  std::string out(kStateMagic);
  const uint64_t n = params.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out.append(reinterpret_cast<const char*>(&adam_step), 8);
  for (absl::Span<const float> a : {params, m, v}) {
    out.append(reinterpret_cast<const char*>(a.data()), a.size() * sizeof(float));
  }
  const uint32_t crc = base::Crc32c(out.data(), out.size());
  out.append(reinterpret_cast<const char*>(&crc), 4);
  return out;
}

absl::Status DecodeDenseState(absl::string_view state, absl::Span<float> params,
                              absl::Span<float> m, absl::Span<float> v, int64_t* adam_step) {
  const size_t header = kStateMagic.size() + 16;
  if (state.size() < header + 4 || state.substr(0, kStateMagic.size()) != kStateMagic) {
    return absl::DataLossError("dense state: not a dense model state (bad header)");
  }
  uint32_t crc = 0;
  std::memcpy(&crc, state.data() + state.size() - 4, 4);
  if (crc != base::Crc32c(state.data(), state.size() - 4)) {
    return absl::DataLossError("dense state: checksum mismatch (truncated or corrupt)");
  }
  uint64_t n = 0;
  int64_t t = 0;
  std::memcpy(&n, state.data() + kStateMagic.size(), 8);
  std::memcpy(&t, state.data() + kStateMagic.size() + 8, 8);
  if (n != params.size() || state.size() != header + 3 * n * sizeof(float) + 4) {
    return absl::InvalidArgumentError(absl::StrCat("dense state has ", n,
                                                   " parameters, this model has ", params.size(),
                                                   "; same flags as the saved run?"));
  }
  const char* p = state.data() + header;
  for (absl::Span<float> a : {params, m, v}) {
    std::memcpy(a.data(), p, n * sizeof(float));
    p += n * sizeof(float);
  }
  *adam_step = t;
  return absl::OkStatus();
}

}  // namespace tessera::trainer_internal
