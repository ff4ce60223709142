// tessera-cli export.
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "tools/cli/cli.h"
#include "tools/npz.h"

namespace tessera::cli {

namespace {

// An .npz array of `values`, of NumPy type `dtype` ("<i8", "<f4").
template <typename T>
tessera::tools::NpyArray Array(const std::string& dtype, std::vector<int64_t> shape,
                               const std::vector<T>& values) {
  tessera::tools::NpyArray a;
  a.dtype = dtype;
  a.shape = std::move(shape);
  a.data.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(a.data.data(), values.data(), a.data.size());
  return a;
}

}  // namespace

int Export(client::EmbeddingClient& tables, const std::string& table) {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (table.empty() || out.empty()) return Refuse("export needs --table=NAME and --out=FILE.npz");
  embedding::ExportOptions options;
  options.since_step = absl::GetFlag(FLAGS_since_step);
  options.with_state = absl::GetFlag(FLAGS_with_state);
  embedding::RowBlock all;  // every block, one after the other
  absl::Status exported = tables.ExportRows(table, options, [&](const embedding::RowBlock& b) {
    all.dim = b.dim;
    all.state_floats = b.state_floats;
    all.ids.insert(all.ids.end(), b.ids.begin(), b.ids.end());
    all.weights.insert(all.weights.end(), b.weights.begin(), b.weights.end());
    all.state.insert(all.state.end(), b.state.begin(), b.state.end());
    all.last_steps.insert(all.last_steps.end(), b.last_steps.begin(), b.last_steps.end());
    all.update_counts.insert(all.update_counts.end(), b.update_counts.begin(),
                             b.update_counts.end());
    return absl::OkStatus();
  });
  if (!exported.ok()) return Fail("export", exported);
  if (all.ids.empty()) {  // no rows: the table's dim from its config
    absl::StatusOr<tessera::v1::TableConfig> config = tables.Config(table);
    if (config.ok()) all.dim = config->dim();
  }
  const int64_t n = static_cast<int64_t>(all.ids.size());
  std::map<std::string, tessera::tools::NpyArray> arrays = {
      {"ids", Array("<i8", {n}, all.ids)},
      {"weights", Array("<f4", {n, all.dim}, all.weights)},
      {"last_step", Array("<i8", {n}, all.last_steps)},
      {"update_count", Array("<i8", {n}, all.update_counts)}};
  if (options.with_state) arrays["state"] = Array("<f4", {n, all.state_floats}, all.state);
  if (absl::Status written = tessera::tools::WriteNpz(out, arrays); !written.ok()) {
    return Refuse(absl::StrCat("export: ", written.message()));
  }
  std::printf("exported %lld rows of table '%s' (dim %d%s) to %s\n", static_cast<long long>(n),
              table.c_str(), all.dim, options.with_state ? ", with optimizer state" : "",
              out.c_str());
  return 0;
}

}  // namespace tessera::cli
