// tessera-cli lookup, export and import.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/channel_policy.h"
#include "grpcpp/grpcpp.h"
#include "tessera/v1/embedding_service.grpc.pb.h"
#include "tools/cli/cli.h"
#include "tools/npz.h"

namespace tessera::cli {

namespace {

// Array `name` of the .npz arrays.
tessera::tools::NpyArray Array(const std::string& dtype, std::vector<int64_t> shape,
                               const std::string& bytes) {
  tessera::tools::NpyArray a;
  a.dtype = dtype;
  a.shape = std::move(shape);
  a.data = bytes;
  return a;
}

// --ids into `req`: ids are 64-bit patterns, so an unsigned hash names the int64 of the
// same bits. False (with a message) for a bad id.
bool ParseIds(tessera::v1::LookupRequest* req) {
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_ids), ',', absl::SkipEmpty())) {
    int64_t id = 0;
    uint64_t unsigned_id = 0;
    if (absl::SimpleAtoi(part, &id)) {
      req->add_ids(id);
    } else if (absl::SimpleAtoi(part, &unsigned_id)) {
      req->add_ids(static_cast<int64_t>(unsigned_id));
    } else {
      std::cerr << "tessera-cli: --ids: bad id '" << part << "'\n";
      return false;
    }
  }
  return true;
}

}  // namespace

int Export(tessera::v1::Coordinator::Stub& stub, const std::string& table) {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (table.empty() || out.empty()) {
    std::cerr << "tessera-cli: export needs --table=NAME and --out=FILE.npz\n";
    return 1;
  }
  tessera::v1::ExportRowsRequest req;
  req.set_table(table);
  req.set_since_step(absl::GetFlag(FLAGS_since_step));
  req.set_with_state(absl::GetFlag(FLAGS_with_state));
  auto ctx = Context(kCheckpointDeadlineMs);
  auto reader = stub.ExportRows(ctx.get(), req);
  std::string ids, weights, state, last_steps, update_counts;
  int dim = 0, state_floats = 0;
  tessera::v1::RowChunk chunk;
  while (reader->Read(&chunk)) {
    dim = chunk.dim();
    state_floats = chunk.state_floats();
    ids += chunk.ids();
    weights += chunk.weights();
    state += chunk.state();
    last_steps += chunk.last_steps();
    update_counts += chunk.update_counts();
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) return Fail("export", s);
  if (dim == 0) {  // no rows: the table's dim from its config
    auto lctx = Context();
    tessera::v1::ListTablesResponse tables;
    if (stub.ListTables(lctx.get(), {}, &tables).ok()) {
      for (const auto& t : tables.tables()) {
        if (t.name() == table) dim = t.dim();
      }
    }
  }
  const int64_t n = static_cast<int64_t>(ids.size() / sizeof(int64_t));
  std::map<std::string, tessera::tools::NpyArray> arrays = {
      {"ids", Array("<i8", {n}, ids)},
      {"weights", Array("<f4", {n, dim}, weights)},
      {"last_step", Array("<i8", {n}, last_steps)},
      {"update_count", Array("<i8", {n}, update_counts)}};
  if (absl::GetFlag(FLAGS_with_state)) {
    arrays["state"] = Array("<f4", {n, state_floats}, state);
  }
  absl::Status written = tessera::tools::WriteNpz(out, arrays);
  if (!written.ok()) {
    std::cerr << "tessera-cli: export: " << written.message() << "\n";
    return 1;
  }
  std::printf("exported %lld rows of table '%s' (dim %d%s) to %s\n", static_cast<long long>(n),
              table.c_str(), dim, absl::GetFlag(FLAGS_with_state) ? ", with optimizer state" : "",
              out.c_str());
  return 0;
}

int Import(tessera::v1::Coordinator::Stub& stub, const std::string& table) {
  const std::string in = absl::GetFlag(FLAGS_in);
  if (table.empty() || in.empty()) {
    std::cerr << "tessera-cli: import needs --table=NAME and --in=FILE.npz\n";
    return 1;
  }
  auto arrays = tessera::tools::ReadNpz(in);
  if (!arrays.ok()) {
    std::cerr << "tessera-cli: import: " << arrays.status().message() << "\n";
    return 1;
  }
  auto need = [&](const std::string& name, const std::string& dtype,
                  size_t rank) -> const tessera::tools::NpyArray* {
    auto it = arrays->find(name);
    if (it == arrays->end()) return nullptr;
    if (it->second.dtype != dtype || it->second.shape.size() != rank) {
      std::cerr << "tessera-cli: import: array '" << name << "' must be " << dtype << " of rank "
                << rank << "\n";
      std::exit(1);
    }
    return &it->second;
  };
  const auto* ids = need("ids", "<i8", 1);
  const auto* weights = need("weights", "<f4", 2);
  if (ids == nullptr || weights == nullptr) {
    std::cerr << "tessera-cli: import: " << in << " needs arrays 'ids' and 'weights'\n";
    return 1;
  }
  const auto* state = need("state", "<f4", 2);
  const auto* last_steps = need("last_step", "<i8", 1);
  const auto* update_counts = need("update_count", "<i8", 1);
  const int64_t n = ids->shape[0];
  if (weights->shape[0] != n || (state != nullptr && state->shape[0] != n) ||
      (last_steps != nullptr && last_steps->shape[0] != n) ||
      (update_counts != nullptr && update_counts->shape[0] != n)) {
    std::cerr << "tessera-cli: import: every array must have one row per id (" << n << ")\n";
    return 1;
  }
  const int64_t dim = weights->shape[1];
  const int64_t sf = state != nullptr ? state->shape[1] : 0;
  constexpr int64_t kRows = 1 << 16;  // rows per request
  for (int64_t begin = 0; begin < n; begin += kRows) {
    const int64_t count = std::min(kRows, n - begin);
    tessera::v1::ImportRowsRequest req;
    req.set_table(table);
    auto* rows = req.mutable_rows();
    rows->set_dim(static_cast<int32_t>(dim));
    rows->set_ids(ids->data.substr(begin * 8, count * 8));
    rows->set_weights(weights->data.substr(begin * dim * 4, count * dim * 4));
    if (state != nullptr) {
      rows->set_state_floats(static_cast<int32_t>(sf));
      rows->set_state(state->data.substr(begin * sf * 4, count * sf * 4));
    }
    if (last_steps != nullptr) rows->set_last_steps(last_steps->data.substr(begin * 8, count * 8));
    if (update_counts != nullptr) {
      rows->set_update_counts(update_counts->data.substr(begin * 8, count * 8));
    }
    auto ctx = Context();
    tessera::v1::ImportRowsResponse resp;
    grpc::Status s = stub.ImportRows(ctx.get(), req, &resp);
    if (!s.ok()) {
      return Fail(absl::StrCat("import (", begin, " of ", n, " rows stored before this)"), s);
    }
  }
  std::printf("imported %lld rows into table '%s' (dim %lld%s)\n", static_cast<long long>(n),
              table.c_str(), static_cast<long long>(dim),
              state != nullptr ? ", with optimizer state" : "");
  return 0;
}

int Lookup(Coordinator::Stub& stub, const std::string& table) {
  if (table.empty() || absl::GetFlag(FLAGS_ids).empty()) {
    std::cerr << "tessera-cli: lookup needs --table=NAME and --ids=ID,ID,... (read only: "
                 "ids never stored show their initial weights)\n";
    return 1;
  }
  tessera::v1::LookupRequest req;
  req.set_table(table);
  req.set_read_only(true);
  if (!ParseIds(&req)) return 1;
  auto ctx = Context();
  tessera::v1::LookupResponse resp;
  grpc::Status s = stub.Lookup(ctx.get(), req, &resp);
  if (!s.ok()) return Fail("lookup", s);
  for (int i = 0; i < req.ids_size(); ++i) {
    std::printf("%lld:", static_cast<long long>(req.ids(i)));
    for (int j = 0; j < resp.dim(); ++j) std::printf(" %.6f", resp.values(i * resp.dim() + j));
    std::printf("\n");
  }
  return 0;
}

}  // namespace tessera::cli
