// Scenario checks and defaults (Normalize).
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "benchmarks/bench/runner.h"
#include "embedding/dtype.h"
#include "embedding/optimizer.h"

namespace tessera::bench {
namespace {

// InvalidArgument naming scenario `s` and `what` is wrong with it.
absl::Status Bad(const Scenario& s, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("scenario '", s.name(), "': ", what));
}

// Where the tables live, and their shapes.
absl::Status NormalizeTables(Scenario* s) {
  auto bad = [s](const std::string& what) { return Bad(*s, what); };
  if (s->mode().empty()) s->set_mode("inproc");
  if (s->mode() != "inproc" && s->mode() != "coordinator" && s->mode() != "smart" &&
      s->mode() != "redis" && s->mode() != "cuda") {
    return bad(absl::StrCat("mode must be inproc, coordinator, smart, redis or cuda, got '",
                            s->mode(), "'"));
  }
  if (s->mode() == "cuda" && s->shards() > 1) return bad("cuda: one GPU (shards 1)");
  if (s->shards() == 0) s->set_shards(1);
  if (s->shards() < 1 || s->shards() > 64) return bad("shards must be in [1, 64]");
  if (s->mode() == "redis" && s->shards() != 1) return bad("redis: one server (shards 1)");
  if (s->batch_size() == 0) s->set_batch_size(4096);
  if (s->batch_size() < 1) return bad("batch_size must be >= 1");
  if (s->ids_per_sample() == 0) s->set_ids_per_sample(1);
  if (s->ids_per_sample() < 1) return bad("ids_per_sample must be >= 1");
  if (s->tables().empty()) {
    TableSpec* t = s->add_tables();
    t->set_rows(1'000'000);
    t->set_dim(64);
  }
  for (TableSpec& t : *s->mutable_tables()) {
    if (t.count() == 0) t.set_count(1);
    if (t.dtype().empty()) t.set_dtype("fp32");
    if (t.count() < 1 || t.rows() < 1 || t.dim() < 1) {
      return bad("each table needs count >= 1, rows >= 1 and dim >= 1");
    }
    TESSERA_RETURN_IF_ERROR(embedding::ParseDtypeName(t.dtype()).status());
    if (s->mode() == "redis" && t.dtype() != "fp32")
      return bad("redis: the baseline stores fp32 rows");
  }
  return absl::OkStatus();
}

// The ids and the workload.
absl::Status NormalizeWorkload(Scenario* s) {
  auto bad = [s](const std::string& what) { return Bad(*s, what); };
  if (s->distribution().empty()) s->set_distribution("uniform");
  if (s->distribution() != "uniform" && s->distribution() != "zipf") {
    return bad("distribution must be uniform or zipf");
  }
  if (s->zipf_s() == 0) s->set_zipf_s(1.05);
  if (s->zipf_s() <= 0) return bad("zipf_s must be > 0");
  if (s->optimizer().empty()) s->set_optimizer("adagrad");
  TESSERA_RETURN_IF_ERROR(embedding::ParseOptimizerName(s->optimizer()).status());
  if (s->workload().empty()) s->set_workload("lookup_update");
  const std::string& w = s->workload();
  if (w != "lookup" && w != "update" && w != "lookup_update" && w != "train") {
    return bad("workload must be lookup, update, lookup_update or train");
  }
  if (s->max_staleness() < 0) return bad("max_staleness must be >= 0");
  if (s->sparse_threads() < 0) return bad("sparse_threads must be >= 0 (0 = every CPU)");
  if (w == "train") {
    for (const TableSpec& t : s->tables()) {
      if (t.dim() != s->tables(0).dim()) return bad("train: every table needs the same dim");
    }
  }
  if (w == "train" && s->bottom_mlp().empty()) {
    for (int width : {512, 256, 64}) s->add_bottom_mlp(width);
  }
  if (w == "train" && s->top_mlp().empty()) {
    for (int width : {512, 256}) s->add_top_mlp(width);
  }
  for (int width : s->bottom_mlp()) {
    if (width < 1) return bad("bottom_mlp widths must be >= 1");
  }
  for (int width : s->top_mlp()) {
    if (width < 1) return bad("top_mlp widths must be >= 1");
  }
  return absl::OkStatus();
}

// The dense half, the workers and the clock.
absl::Status NormalizeTraining(Scenario* s) {
  auto bad = [s](const std::string& what) { return Bad(*s, what); };
  const std::string& w = s->workload();
  if (s->dense_backend().empty()) s->set_dense_backend("cpu");
  if (s->dense_backend() != "cpu" && s->dense_backend() != "cuda") {
    return bad("dense_backend must be cpu or cuda");
  }
  if (s->dense_backend() == "cuda" && w != "train") {
    return bad("dense_backend cuda needs workload train");
  }
  if (s->workers() == 0) s->set_workers(1);
  if (s->workers() < 1 || s->workers() > 64) return bad("workers must be in [1, 64]");
  if (s->workers() > 1 && (w != "train" || (s->mode() != "smart" && s->mode() != "coordinator"))) {
    return bad("workers > 1 needs workload train through a cluster (mode smart or coordinator)");
  }
  if (s->warmup_seconds() == 0) s->set_warmup_seconds(1);
  if (s->seconds() == 0) s->set_seconds(5);
  if (s->warmup_seconds() < 0 || s->seconds() <= 0) return bad("seconds must be > 0");
  if (s->seed() == 0) s->set_seed(1);
  return absl::OkStatus();
}

}  // namespace

absl::Status Normalize(Scenario* s) {
  if (s->name().empty()) return absl::InvalidArgumentError("every scenario needs a name");
  TESSERA_RETURN_IF_ERROR(NormalizeTables(s));
  TESSERA_RETURN_IF_ERROR(NormalizeWorkload(s));
  return NormalizeTraining(s);
}

}  // namespace tessera::bench
