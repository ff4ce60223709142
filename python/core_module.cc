// tessera._core: the C++ core as a Python module. A collection of tables in the calling
// process, in memory (embedding::InProcessCollection) or durable in a directory with
// checkpoints (storage::DurableCollection): the tables of tessera.local
// (python/tessera/local.py), which tessera.torch uses as it uses a cluster's client.
// Configs travel as serialized TableConfig messages; ids, rows and gradients as numpy
// arrays, without copies where the layout allows; the GIL is released while the core
// works. A failed call raises _core.Error(code, message) with absl's status code.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "embedding/collection.h"
#include "embedding/inprocess_collection.h"
#include "embedding/storage/durable_collection.h"
#include "tessera/v1/config.pb.h"

namespace py = pybind11;

namespace tessera::python {
namespace {

using Ids = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using Floats = py::array_t<float, py::array::c_style | py::array::forcecast>;
using Offsets = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

// A status that is not OK, thrown to Python as _core.Error(code, message).
struct StatusError {
  absl::Status status;
};

void Check(const absl::Status& s) {
  if (!s.ok()) throw StatusError{s};
}

template <typename T>
T Take(absl::StatusOr<T> s) {
  Check(s.status());
  return *std::move(s);
}

// Runs `call` (a call of the core) with the GIL released, and raises what it returns.
template <typename Call>
void WithoutGil(const Call& call) {
  absl::Status s;
  {
    py::gil_scoped_release release;
    s = call();
  }
  Check(s);
}

embedding::LookupOptions LookupOptionsOf(bool read_only) {
  embedding::LookupOptions options;
  options.insert_missing = !read_only;
  return options;
}

absl::Span<const int64_t> SpanOf(const Ids& ids) {
  return absl::MakeConstSpan(ids.data(), static_cast<size_t>(ids.size()));
}

absl::Span<const float> SpanOf(const Floats& values) {
  return absl::MakeConstSpan(values.data(), static_cast<size_t>(values.size()));
}

template <typename Message>
Message Parse(const py::bytes& bytes, const char* what) {
  Message m;
  if (!m.ParseFromString(std::string(bytes))) {
    throw StatusError{absl::InvalidArgumentError(absl::StrCat("not a serialized ", what))};
  }
  return m;
}

py::dict InfoDict(const embedding::CheckpointInfo& info) {
  py::dict d;
  d["model"] = info.model;
  d["step"] = info.step;
  d["rows"] = info.rows;
  d["bytes"] = info.bytes;
  d["created_unix_ms"] = info.created_unix_ms;
  d["seconds"] = info.seconds;
  return d;
}

// The tables of one process.
class Tables {
 public:
  // `data_dir` empty: in memory; else durable there (created if missing), with checkpoints.
  // `shards`: partitions of each table (each a lock domain; threads serve them in
  // parallel); `threads` 0: the CPUs this process may use; `memory_limit` as
  // InProcessOptions (0: the default budget).
  Tables(const std::string& data_dir, int shards, int threads, int64_t memory_limit) {
    if (data_dir.empty()) {
      embedding::InProcessOptions o;
      o.num_shards = shards;
      o.threads = threads;
      o.memory_limit = memory_limit;
      tables_ = Take(embedding::NewInProcessCollection(o));
      return;
    }
    storage::DurableOptions o;
    o.data_dir = data_dir;
    o.num_shards = shards;
    o.threads = threads;
    o.memory_limit = memory_limit;
    tables_ = Take(storage::DurableCollection::Open(o));
  }

  py::bytes CreateTable(const py::bytes& config) {
    const auto c = Parse<v1::TableConfig>(config, "TableConfig");
    Check(tables_->CreateTable(c));
    for (const v1::TableConfig& t : Take(tables_->ListTables())) {
      if (t.name() == c.name()) return Remember(t);
    }
    throw StatusError{absl::InternalError("a created table is not listed")};
  }

  std::vector<py::bytes> ListTables() {
    std::vector<py::bytes> out;
    dims_.clear();
    for (const v1::TableConfig& t : Take(tables_->ListTables())) out.push_back(Remember(t));
    return out;
  }

  void DropTable(const std::string& name) {
    Check(tables_->DropTable(name));
    dims_.erase(name);
  }

  py::bytes AlterTable(const std::string& name, const py::bytes& optimizer) {
    return Remember(
        Take(tables_->AlterTable(name, Parse<v1::OptimizerConfig>(optimizer, "OptimizerConfig"))));
  }

  // Rows of `ids`: (len(ids), dim); `read_only` creates no row.
  py::array_t<float> Lookup(const std::string& name, const Ids& ids, bool read_only) {
    const int dim = Dim(name);
    py::array_t<float> out({static_cast<py::ssize_t>(ids.size()), static_cast<py::ssize_t>(dim)});
    WithoutGil([&] {
      return tables_->Lookup(name, SpanOf(ids), absl::MakeSpan(out.mutable_data(), out.size()),
                             LookupOptionsOf(read_only));
    });
    return out;
  }

  // {table: ids} -> {table: rows}, the tables served in parallel.
  py::dict LookupMany(const std::map<std::string, Ids>& tables, bool read_only) {
    std::vector<embedding::TableBags> bags;
    std::map<std::string, py::array_t<float>> out;
    for (const auto& [name, ids] : tables) {
      const int dim = Dim(name);
      auto rows =
          py::array_t<float>({static_cast<py::ssize_t>(ids.size()), static_cast<py::ssize_t>(dim)});
      embedding::TableBags b;
      b.table = name;
      b.ids = SpanOf(ids);
      b.out = absl::MakeSpan(rows.mutable_data(), rows.size());
      bags.push_back(b);
      out.emplace(name, std::move(rows));
    }
    WithoutGil([&] { return tables_->LookupBatch(bags, LookupOptionsOf(read_only)); });
    py::dict d;
    for (auto& [name, rows] : out) d[py::str(name)] = std::move(rows);
    return d;
  }

  // The SUM of each bag of ids (CSR `offsets`, bags + 1) of every table, unweighted, into
  // one (tables, bags, dim) array: the tables must share a dim and a bag count. The sums
  // run in each bag's order from zero, as torch's index_add does.
  py::array_t<float> PooledLookup(const std::vector<std::string>& names,
                                  const std::vector<Ids>& ids, const std::vector<Offsets>& offsets,
                                  bool read_only) {
    const auto [dim, bags] = PooledShape(names, ids, offsets);
    py::array_t<float> out({static_cast<py::ssize_t>(names.size()), static_cast<py::ssize_t>(bags),
                            static_cast<py::ssize_t>(dim)});
    std::vector<embedding::TableBags> parts;
    for (size_t t = 0; t < names.size(); ++t) {
      embedding::TableBags b;
      b.table = names[t];
      b.ids = SpanOf(ids[t]);
      b.offsets = absl::MakeConstSpan(offsets[t].data(), static_cast<size_t>(offsets[t].size()));
      b.pooling = v1::SUM;
      b.out = absl::MakeSpan(out.mutable_data() + t * bags * dim, bags * dim);
      parts.push_back(b);
    }
    WithoutGil([&] { return tables_->LookupBatch(parts, LookupOptionsOf(read_only)); });
    return out;
  }

  // The gradients PooledLookup's bags give their rows: for each table, its distinct ids in
  // order of first sight and, for each, the sum from zero of grads[table, bag] over the
  // id's places in ascending order (torch's accumulation into an indexed tensor): {table:
  // (distinct ids, (distinct, dim) gradients)}.
  py::dict PooledGradients(const std::vector<std::string>& names, const std::vector<Ids>& ids,
                           const std::vector<Offsets>& offsets, const Floats& grads) {
    const auto [dim, bags] = PooledShape(names, ids, offsets);
    if (grads.size() != static_cast<py::ssize_t>(names.size() * bags * dim)) {
      throw StatusError{absl::InvalidArgumentError(
          absl::StrCat("gradients of ", grads.size(), " values for ", names.size(), " tables x ",
                       bags, " bags x dim ", dim))};
    }
    py::dict out;
    for (size_t t = 0; t < names.size(); ++t) {
      const int64_t* id = ids[t].data();
      const int32_t* off = offsets[t].data();
      const float* g = grads.data() + t * bags * dim;
      absl::flat_hash_map<int64_t, int32_t> place;
      std::vector<int64_t> unique;
      std::vector<float> sums;
      place.reserve(static_cast<size_t>(ids[t].size()));
      for (size_t b = 0; b < bags; ++b) {
        for (int32_t j = off[b]; j < off[b + 1]; ++j) {
          auto [it, added] = place.try_emplace(id[j], static_cast<int32_t>(unique.size()));
          if (added) {
            unique.push_back(id[j]);
            sums.resize(sums.size() + dim, 0.0f);
          }
          float* row = sums.data() + static_cast<size_t>(it->second) * dim;
          for (size_t d = 0; d < dim; ++d) row[d] += g[b * dim + d];
        }
      }
      const auto n = static_cast<py::ssize_t>(unique.size());
      out[py::str(names[t])] =
          py::make_tuple(py::array_t<int64_t>(n, unique.data()),
                         py::array_t<float>({n, static_cast<py::ssize_t>(dim)}, sums.data()));
    }
    return out;
  }

  // [(table, ids, gradients (len(ids), dim))] applied at `step` as one batch (every part
  // checked before any applies): {table: distinct rows updated}.
  py::dict PushMany(const std::vector<std::tuple<std::string, Ids, Floats>>& parts, int64_t step) {
    std::vector<embedding::TableGradients> grads;
    for (const auto& [name, ids, g] : parts) {
      grads.push_back(embedding::TableGradients{name, SpanOf(ids), SpanOf(g)});
    }
    std::vector<int64_t> updated;
    embedding::PushOptions options;
    options.rows_updated = &updated;
    WithoutGil([&] { return tables_->PushBatch(grads, step, options); });
    py::dict d;
    for (size_t i = 0; i < parts.size(); ++i) {
      d[py::str(std::get<0>(parts[i]))] = i < updated.size() ? updated[i] : 0;
    }
    return d;
  }

  // Every stored row of `name` (or those updated at or after `since_step`): a dict of
  // ids, weights (n, dim), last_step, update_count and, with `with_state`, state.
  py::dict Export(const std::string& name, int64_t since_step, bool with_state) {
    embedding::ExportOptions options;
    options.since_step = since_step;
    options.with_state = with_state;
    embedding::RowBlock all;
    all.dim = Dim(name);
    Check(tables_->ExportRows(name, options, [&](const embedding::RowBlock& b) {
      all.state_floats = b.state_floats;
      for (size_t i = 0; i < b.size(); ++i) {
        all.Append(b.ids[i], &b.weights[i * b.dim],
                   b.state_floats > 0 ? &b.state[i * b.state_floats] : nullptr,
                   b.last_steps.empty() ? -1 : b.last_steps[i],
                   b.update_counts.empty() ? 0 : b.update_counts[i]);
      }
      return absl::OkStatus();
    }));
    const auto n = static_cast<py::ssize_t>(all.size());
    py::dict d;
    d["ids"] = py::array_t<int64_t>(n, all.ids.data());
    d["weights"] = py::array_t<float>({n, static_cast<py::ssize_t>(all.dim)}, all.weights.data());
    d["last_step"] = py::array_t<int64_t>(n, all.last_steps.data());
    d["update_count"] = py::array_t<int64_t>(n, all.update_counts.data());
    if (with_state) {
      d["state"] =
          py::array_t<float>({n, static_cast<py::ssize_t>(all.state_floats)}, all.state.data());
    }
    return d;
  }

  py::dict Checkpoint(int64_t step, const std::string& model,
                      const std::map<std::string, py::bytes>& attachments) {
    embedding::Attachments blobs;
    for (const auto& [key, value] : attachments) blobs[key] = std::string(value);
    embedding::CheckpointOptions options;
    options.model = model;
    return InfoDict(Take(Checkpoints()->Checkpoint(step, blobs, options)));
  }

  // (info, attachments) of the checkpoint restored.
  py::tuple Restore(int64_t step, const std::string& model, bool all_models) {
    embedding::RestoreOptions options;
    options.model = model;
    options.all_models = all_models;
    embedding::Attachments blobs;
    const embedding::CheckpointInfo info = Take(Checkpoints()->Restore(step, &blobs, options));
    dims_.clear();
    py::dict attachments;
    for (const auto& [key, value] : blobs) attachments[py::str(key)] = py::bytes(value);
    return py::make_tuple(InfoDict(info), attachments);
  }

  py::list ListCheckpoints() {
    py::list out;
    for (const auto& info : Take(Checkpoints()->ListCheckpoints())) out.append(InfoDict(info));
    return out;
  }

  py::dict Usage(const std::string& name) {
    const embedding::TableUsage u = Take(tables_->Usage(name));
    py::dict d;
    d["rows"] = u.rows;
    d["memory_bytes"] = u.memory_bytes;
    d["evictions"] = u.evictions;
    return d;
  }

 private:
  py::bytes Remember(const v1::TableConfig& t) {
    dims_[t.name()] = t.dim();
    return py::bytes(t.SerializeAsString());
  }

  // (dim, bags) of PooledLookup's tables; InvalidArgument unless they agree and the
  // offsets are CSR offsets over their ids.
  std::pair<size_t, size_t> PooledShape(const std::vector<std::string>& names,
                                        const std::vector<Ids>& ids,
                                        const std::vector<Offsets>& offsets) {
    if (names.empty() || ids.size() != names.size() || offsets.size() != names.size()) {
      throw StatusError{absl::InvalidArgumentError("one ids and one offsets array a table")};
    }
    const int dim = Dim(names[0]);
    const py::ssize_t bags = offsets[0].size() - 1;
    for (size_t t = 0; t < names.size(); ++t) {
      const py::ssize_t n = offsets[t].size();
      const int32_t* off = offsets[t].data();
      bool csr = n == bags + 1 && n >= 1 && off[0] == 0 && off[n - 1] == ids[t].size();
      for (py::ssize_t b = 0; csr && b + 1 < n; ++b) csr = off[b] <= off[b + 1];
      if (Dim(names[t]) != dim || !csr) {
        throw StatusError{absl::InvalidArgumentError(absl::StrCat(
            "table '", names[t], "': pooled lookups of several tables take one dim and ", bags,
            " bags (CSR offsets over the ids) for every table"))};
      }
    }
    return {static_cast<size_t>(dim), static_cast<size_t>(bags)};
  }

  int Dim(const std::string& name) {
    auto it = dims_.find(name);
    if (it == dims_.end()) {
      ListTables();
      it = dims_.find(name);
    }
    if (it == dims_.end()) {
      throw StatusError{absl::NotFoundError(absl::StrCat("table '", name, "' not found"))};
    }
    return it->second;
  }

  embedding::Checkpointing* Checkpoints() {
    embedding::Checkpointing* c = tables_->checkpointing();
    if (c == nullptr) {
      throw StatusError{absl::FailedPreconditionError(
          "checkpoints need tables kept in a directory: tessera.local(data_dir=...)")};
    }
    return c;
  }

  std::unique_ptr<embedding::ShardTables> tables_;
  std::map<std::string, int> dims_;  // of the tables seen, by name
};

}  // namespace
}  // namespace tessera::python

PYBIND11_MODULE(_core, m) {
  using tessera::python::Tables;
  m.doc() = "The Tessera core in this process (see tessera.local).";
  static py::object error = py::reinterpret_borrow<py::object>(
      py::handle(PyErr_NewException("tessera._core.Error", PyExc_RuntimeError, nullptr)));
  m.attr("Error") = error;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const tessera::python::StatusError& e) {
      py::object args =
          py::make_tuple(static_cast<int>(e.status.code()), std::string(e.status.message()));
      PyErr_SetObject(error.ptr(), args.ptr());
    }
  });
  py::class_<Tables>(m, "Tables")
      .def(py::init<const std::string&, int, int, int64_t>(), py::arg("data_dir") = "",
           py::arg("shards") = 1, py::arg("threads") = 0, py::arg("memory_limit") = 0)
      .def("create_table", &Tables::CreateTable)
      .def("list_tables", &Tables::ListTables)
      .def("drop_table", &Tables::DropTable)
      .def("alter_table", &Tables::AlterTable)
      .def("lookup", &Tables::Lookup, py::arg("table"), py::arg("ids"),
           py::arg("read_only") = false)
      .def("lookup_many", &Tables::LookupMany, py::arg("tables"), py::arg("read_only") = false)
      .def("push_many", &Tables::PushMany, py::arg("parts"), py::arg("step"))
      .def("pooled_lookup", &Tables::PooledLookup, py::arg("tables"), py::arg("ids"),
           py::arg("offsets"), py::arg("read_only") = false)
      .def("pooled_gradients", &Tables::PooledGradients, py::arg("tables"), py::arg("ids"),
           py::arg("offsets"), py::arg("grads"))
      .def("export", &Tables::Export, py::arg("table"), py::arg("since_step") = -1,
           py::arg("with_state") = false)
      .def("checkpoint", &Tables::Checkpoint, py::arg("step"), py::arg("model") = "",
           py::arg("attachments") = std::map<std::string, py::bytes>())
      .def("restore", &Tables::Restore, py::arg("step") = -1, py::arg("model") = "",
           py::arg("all_models") = false)
      .def("list_checkpoints", &Tables::ListCheckpoints)
      .def("usage", &Tables::Usage);
}
