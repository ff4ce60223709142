// libFuzzer target over the shard's request handlers: the first byte picks the RPC, the
// rest is parsed as its request message (as gRPC would) and handed to a ShardService over
// an in-process collection, exactly as the server calls it. Tables of several shapes,
// optimizers, dtypes and an evicting row budget exist from the start; fuzzed
// CreateTable calls add more (up to --max_tables). Built with -DTESSERA_FUZZ=ON by clang
// with AddressSanitizer and UndefinedBehaviorSanitizer (scripts/fuzz.sh).
//
// Besides crashes and sanitizer reports it checks what every answer must satisfy: an OK
// lookup holds rows x dim (or bags x dim) finite values; a refused push changes no row.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "embedding/collection.h"
#include "embedding/inprocess_collection.h"
#include "server/shard_service.h"
#include "tessera/v1/embedding_service.pb.h"

namespace {

using namespace tessera;

struct Fixture {
  Fixture() {
    // Rows (and fixed vocabularies' arrays, counted whole) get a memory budget well below
    // the fuzzer's RSS limit (-rss_limit_mb=2048): past it the service refuses them, as a
    // shard with --memory_limit does, instead of the process running out of memory.
    embedding::InProcessOptions options;
    options.num_shards = 2;
    options.memory_limit = int64_t{512} << 20;
    tables = std::move(embedding::NewInProcessCollection(options)).value();
    server::ShardOptions o;
    o.shard_index = 0;
    o.num_shards = 1;
    o.max_batch_ids = 512;
    o.max_tables = 12;
    // A sync-group push waits at most this long for workers that never come (the fuzzer's
    // per-input timeout is 10 s; a request may ask for an hour).
    o.max_sync_wait = std::chrono::milliseconds(20);
    service = std::make_unique<server::ShardService>(tables.get(), o);
    auto make = [&](const char* name, int dim, v1::OptimizerType opt, v1::Dtype dtype,
                    int64_t max_rows, v1::EvictionPolicy policy) {
      v1::CreateTableRequest req;
      v1::TableConfig* c = req.mutable_config();
      c->set_name(name);
      c->set_dim(dim);
      c->set_dtype(dtype);
      c->set_max_rows(max_rows);
      c->mutable_eviction()->set_policy(policy);
      c->mutable_optimizer()->set_type(opt);
      v1::CreateTableResponse resp;
      grpc::ServerContext ctx;
      if (!service->CreateTable(&ctx, &req, &resp).ok()) std::abort();
    };
    make("a", 8, v1::ADAGRAD, v1::FP32, 0, v1::EVICTION_NONE);
    make("b", 3, v1::ADAM, v1::BF16, 0, v1::EVICTION_NONE);
    make("c", 16, v1::FTRL, v1::FP16, 64, v1::EVICTION_LRU);
    make("d", 4, v1::ROWWISE_ADAGRAD, v1::FP32, 32, v1::EVICTION_NONE);
  }
  std::unique_ptr<embedding::ShardTables> tables;
  std::unique_ptr<server::ShardService> service;
};

Fixture* current = nullptr;

// The fixture for the next input. Fuzzed lookups create rows and fuzzed CreateTable calls
// add tables: a fresh fixture every 20000 inputs keeps memory bounded on long runs.
Fixture& NextInput() {
  static int inputs = 0;
  if (current == nullptr || ++inputs % 20000 == 0) {
    delete current;
    current = new Fixture();
  }
  return *current;
}

// A lookup of `ids` of `table` (no pooling, read-only), or empty when it fails.
std::vector<float> Read(const std::string& table,
                        const google::protobuf::RepeatedField<int64_t>& ids) {
  v1::LookupRequest req;
  req.set_table(table);
  *req.mutable_ids() = ids;
  req.set_read_only(true);
  v1::LookupResponse resp;
  grpc::ServerContext ctx;
  if (!current->service->Lookup(&ctx, &req, &resp).ok()) return {};
  return {resp.values().begin(), resp.values().end()};
}

// A push refused because some rows' updates would not be finite has updated the others
// (base/status.h PartlyApplied); every row it left must still read finite.
bool PartlyApplied(const grpc::Status& s) {
  return s.error_message().find("would make weights or optimizer state non-finite") !=
         std::string::npos;
}

bool AllFinite(const std::vector<float>& rows) {
  for (const float v : rows) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

void FuzzLookup(Fixture& env, grpc::ServerContext& ctx, const void* body, int n) {
  v1::LookupRequest req;
  if (!req.ParseFromArray(body, n)) return;
  v1::LookupResponse resp;
  if (env.service->Lookup(&ctx, &req, &resp).ok()) {
    const int rows = req.offsets_size() > 0 ? req.offsets_size() - 1 : req.ids_size();
    if (resp.values_size() != rows * resp.dim()) std::abort();
    for (const float v : resp.values()) {
      if (!std::isfinite(v)) std::abort();
    }
  }
}

void FuzzPushGradients(Fixture& env, grpc::ServerContext& ctx, const void* body, int n) {
  v1::PushGradientsRequest req;
  if (!req.ParseFromArray(body, n)) return;
  const std::vector<float> before = Read(req.table(), req.ids());
  v1::PushGradientsResponse resp;
  const grpc::Status pushed = env.service->PushGradients(&ctx, &req, &resp);
  if (PartlyApplied(pushed)) {
    if (!AllFinite(Read(req.table(), req.ids()))) std::abort();
  } else if (!pushed.ok()) {
    // A refused push changes no row (rows of an evicting table may move to disk and
    // back, but keep their values).
    if (Read(req.table(), req.ids()) != before) {
      std::fprintf(stderr, "refused push changed rows: %s: %s\n", req.ShortDebugString().c_str(),
                   pushed.error_message().c_str());
      std::abort();
    }
  }
}

void FuzzCreateTable(Fixture& env, grpc::ServerContext& ctx, const void* body, int n) {
  v1::CreateTableRequest req;
  if (!req.ParseFromArray(body, n)) return;
  // Keep memory bounded: the fuzzer may ask for dim 65536 tables.
  if (req.config().dim() > 1024) return;
  v1::CreateTableResponse resp;
  (void)env.service->CreateTable(&ctx, &req, &resp);
}

void FuzzStats(Fixture& env, grpc::ServerContext& ctx, const void* body, int n) {
  v1::StatsRequest req;
  if (!req.ParseFromArray(body, n)) return;
  v1::StatsResponse resp;
  (void)env.service->Stats(&ctx, &req, &resp);
}

void FuzzImportRows(Fixture& env, grpc::ServerContext& ctx, const void* body, int n) {
  v1::ImportRowsRequest req;
  if (!req.ParseFromArray(body, n)) return;
  const std::string& packed = req.rows().ids();
  google::protobuf::RepeatedField<int64_t> ids;
  ids.Resize(static_cast<int>(packed.size() / sizeof(int64_t)), 0);
  if (!packed.empty() && ids.size() > 0) {
    std::memcpy(ids.mutable_data(), packed.data(), ids.size() * sizeof(int64_t));
  }
  const std::vector<float> before = Read(req.table(), ids);
  v1::ImportRowsResponse resp;
  const grpc::Status imported = env.service->ImportRows(&ctx, &req, &resp);
  const std::vector<float> after = Read(req.table(), ids);
  // A refused import stores nothing; an accepted one stores finite rows only.
  if (!imported.ok() ? after != before : !AllFinite(after)) {
    std::fprintf(stderr, "import broke its contract: %s: %s\n", req.ShortDebugString().c_str(),
                 imported.error_message().c_str());
    std::abort();
  }
}

void FuzzRegisterSyncGroup(Fixture& env, grpc::ServerContext& ctx, const void* body, int n) {
  // Registers a sync group: later fuzzed pushes of it wait (up to max_sync_wait).
  v1::RegisterSyncGroupRequest req;
  if (!req.ParseFromArray(body, n)) return;
  v1::RegisterSyncGroupResponse resp;
  (void)env.service->RegisterSyncGroup(&ctx, &req, &resp);
}

void FuzzBatchLookup(Fixture& env, grpc::ServerContext& ctx, const void* body, int n) {
  v1::BatchLookupRequest req;
  if (!req.ParseFromArray(body, n)) return;
  v1::BatchLookupResponse resp;
  if (env.service->BatchLookup(&ctx, &req, &resp).ok()) {
    if (resp.tables_size() != req.tables_size()) std::abort();
    for (const v1::TableValues& t : resp.tables()) {
      if (t.values().size() != static_cast<size_t>(t.rows()) * t.dim() * sizeof(float)) {
        std::abort();
      }
      std::vector<float> v(t.values().size() / sizeof(float));
      if (!v.empty()) std::memcpy(v.data(), t.values().data(), t.values().size());
      for (const float x : v) {
        if (!std::isfinite(x)) std::abort();
      }
    }
  }
}

void FuzzBatchPush(Fixture& env, grpc::ServerContext& ctx, const void* body, int n) {
  v1::BatchPushRequest req;
  if (!req.ParseFromArray(body, n)) return;
  // The rows each named table holds for the ids the request names (when they parse).
  std::vector<std::vector<float>> before;
  std::vector<google::protobuf::RepeatedField<int64_t>> ids(req.tables_size());
  for (int i = 0; i < req.tables_size(); ++i) {
    const std::string& packed = req.tables(i).ids();
    const size_t count = packed.size() / sizeof(int64_t);
    ids[i].Resize(static_cast<int>(count), 0);
    if (count > 0) std::memcpy(ids[i].mutable_data(), packed.data(), count * sizeof(int64_t));
    before.push_back(Read(req.tables(i).table(), ids[i]));
  }
  v1::BatchPushResponse resp;
  const grpc::Status pushed = env.service->BatchPushNow(&ctx, req, &resp);
  if (PartlyApplied(pushed)) {
    for (int i = 0; i < req.tables_size(); ++i) {
      if (!AllFinite(Read(req.tables(i).table(), ids[i]))) std::abort();
    }
  } else if (!pushed.ok()) {
    // A refused batch changes no row of any of its tables.
    for (int i = 0; i < req.tables_size(); ++i) {
      if (Read(req.tables(i).table(), ids[i]) != before[i]) {
        std::fprintf(stderr, "refused batched push changed rows: %s: %s\n",
                     req.ShortDebugString().c_str(), pushed.error_message().c_str());
        std::abort();
      }
    }
  } else if (resp.rows_updated_size() != req.tables_size()) {
    std::abort();
  }
}

void FuzzListCheckpoints(Fixture& env, grpc::ServerContext& ctx, const void* body, int n) {
  v1::ListCheckpointsRequest req;
  if (!req.ParseFromArray(body, n)) return;
  v1::ListCheckpointsResponse resp;
  (void)env.service->ListCheckpoints(&ctx, &req, &resp);
}

void FuzzReadChanges(Fixture& env, grpc::ServerContext& ctx, const void* body, int n) {
  v1::ReadChangesRequest req;
  if (!req.ParseFromArray(body, n)) return;
  v1::ReadChangesResponse resp;
  (void)env.service->ReadChanges(&ctx, &req, &resp);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the request (its value mod 8; 240 to 247: ReadChanges; 248 and
  // up: ListCheckpoints), the rest is its bytes.
  static constexpr void (*kRequests[])(Fixture&, grpc::ServerContext&, const void*, int) = {
      FuzzLookup,          FuzzPushGradients,     FuzzCreateTable, FuzzStats,
      FuzzImportRows,      FuzzRegisterSyncGroup, FuzzBatchLookup, FuzzBatchPush,
      FuzzListCheckpoints, FuzzReadChanges};
  Fixture& env = NextInput();
  grpc::ServerContext ctx;
  const int pick = data[0] >= 248 ? 8 : data[0] >= 240 ? 9 : data[0] % 8;
  kRequests[pick](env, ctx, data + 1, static_cast<int>(size - 1));
  return 0;
}
