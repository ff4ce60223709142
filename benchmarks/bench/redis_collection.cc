#include "benchmarks/bench/redis_collection.h"

#include <hiredis.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "embedding/batch_ops.h"
#include "embedding/embedding_table.h"

namespace tessera::bench {
namespace {

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

class RedisCollection final : public embedding::EmbeddingCollection {
 public:
  explicit RedisCollection(redisContext* c) : ctx_(c) {}
  ~RedisCollection() override { redisFree(ctx_); }

  absl::Status CreateTable(const v1::TableConfig& config) override {
    TESSERA_ASSIGN_OR_RETURN(auto t, embedding::EmbeddingTable::Create(config));
    absl::MutexLock lock(&mu_);
    if (tables_.count(config.name())) {
      return absl::AlreadyExistsError(absl::StrCat("table '", config.name(), "' already exists"));
    }
    Table& entry = tables_[config.name()];
    entry.id = static_cast<uint32_t>(tables_.size());
    entry.rows = std::move(t);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<v1::TableConfig>> ListTables() const override {
    absl::MutexLock lock(&mu_);
    std::vector<v1::TableConfig> out;
    for (const auto& [name, t] : tables_) out.push_back(t.rows->config());
    return out;
  }

  absl::Status Lookup(absl::string_view table, absl::Span<const int64_t> ids, absl::Span<float> out,
                      const embedding::LookupOptions&) override {
    absl::MutexLock lock(&mu_);
    TESSERA_ASSIGN_OR_RETURN(Table * t, Find(table));
    const int dim = t->rows->dim();
    TESSERA_ASSIGN_OR_RETURN(Reply r, Mget(*t, ids));
    for (size_t i = 0; i < ids.size(); ++i) {
      const redisReply* e = r->element[i];
      if (e->type == REDIS_REPLY_STRING && e->len >= static_cast<size_t>(4 * dim)) {
        std::memcpy(out.data() + i * dim, e->str, 4 * dim);
      } else {
        t->rows->InitialWeights(ids[i], out.data() + i * dim);
      }
    }
    return absl::OkStatus();
  }

  absl::Status PooledLookup(absl::string_view table, absl::Span<const int64_t> ids,
                            absl::Span<const int32_t> offsets, absl::Span<const float> weights,
                            v1::Pooling pooling, absl::Span<float> out,
                            const embedding::LookupOptions& o) override {
    int dim = 0;
    {
      absl::MutexLock lock(&mu_);
      TESSERA_ASSIGN_OR_RETURN(Table * t, Find(table));
      dim = t->rows->dim();
    }
    std::vector<float> rows(ids.size() * dim);
    TESSERA_RETURN_IF_ERROR(Lookup(table, ids, absl::MakeSpan(rows), o));
    std::vector<int32_t> identity(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) identity[i] = static_cast<int32_t>(i);
    embedding::PoolBags(rows.data(), dim, identity, offsets, weights, pooling, out.data());
    return absl::OkStatus();
  }

  absl::Status PushGradients(absl::string_view table, absl::Span<const int64_t> ids,
                             absl::Span<const float> gradients, int64_t step) override {
    absl::MutexLock lock(&mu_);
    TESSERA_ASSIGN_OR_RETURN(Table * t, Find(table));
    const int dim = t->rows->dim();
    const int sf = t->rows->optimizer().StateFloats();
    std::vector<int64_t> unique;
    std::vector<int32_t> inverse;
    embedding::Unique(ids, &unique, &inverse);
    std::vector<float> summed(unique.size() * dim, 0.0f);
    embedding::SumRowsByInverse(gradients.data(), dim, inverse, summed.data());
    TESSERA_ASSIGN_OR_RETURN(Reply r, Mget(*t, unique));
    const size_t value_bytes = 4 * (dim + sf) + 8;
    std::vector<std::string> keys(unique.size()), values(unique.size());
    std::vector<float> row(dim + sf);
    for (size_t i = 0; i < unique.size(); ++i) {
      const redisReply* e = r->element[i];
      int64_t updates = 0;
      if (e->type == REDIS_REPLY_STRING && e->len == value_bytes) {
        std::memcpy(row.data(), e->str, 4 * (dim + sf));
        std::memcpy(&updates, e->str + 4 * (dim + sf), 8);
      } else {
        t->rows->InitialWeights(unique[i], row.data());
        t->rows->optimizer().InitState(row.data() + dim);
      }
      t->rows->optimizer().Update(row.data(), row.data() + dim, summed.data() + i * dim, updates);
      ++updates;
      keys[i] = Key(*t, unique[i]);
      values[i].assign(reinterpret_cast<const char*>(row.data()), 4 * (dim + sf));
      values[i].append(reinterpret_cast<const char*>(&updates), 8);
    }
    std::vector<const char*> argv = {"MSET"};
    std::vector<size_t> lens = {4};
    for (size_t i = 0; i < unique.size(); ++i) {
      argv.push_back(keys[i].data());
      lens.push_back(keys[i].size());
      argv.push_back(values[i].data());
      lens.push_back(values[i].size());
    }
    Reply set(static_cast<redisReply*>(
        redisCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data())));
    if (set == nullptr || set->type == REDIS_REPLY_ERROR) {
      return absl::UnavailableError(absl::StrCat("redis MSET failed: ", ctx_->errstr));
    }
    (void)step;
    return absl::OkStatus();
  }

  absl::StatusOr<embedding::TableUsage> Usage(absl::string_view table) const override {
    return embedding::TableUsage{};
  }
  int num_shards() const override { return 1; }
  // The baseline measures lookups and pushes; its tables live as long as the run.
  absl::Status DropTable(absl::string_view table) override {
    return absl::UnimplementedError("the Redis baseline does not drop tables");
  }

 private:
  struct Table {
    uint32_t id = 0;
    std::unique_ptr<embedding::EmbeddingTable> rows;  // config, initial weights, optimizer
  };

  absl::StatusOr<Table*> Find(absl::string_view table) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = tables_.find(std::string(table));
    if (it == tables_.end())
      return absl::NotFoundError(absl::StrCat("table '", table, "' not found"));
    return &it->second;
  }

  static std::string Key(const Table& t, int64_t id) {
    std::string k(12, '\0');
    std::memcpy(k.data(), &t.id, 4);
    std::memcpy(k.data() + 4, &id, 8);
    return k;
  }

  absl::StatusOr<Reply> Mget(const Table& t, absl::Span<const int64_t> ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::string> keys(ids.size());
    std::vector<const char*> argv = {"MGET"};
    std::vector<size_t> lens = {4};
    for (size_t i = 0; i < ids.size(); ++i) {
      keys[i] = Key(t, ids[i]);
      argv.push_back(keys[i].data());
      lens.push_back(keys[i].size());
    }
    Reply r(static_cast<redisReply*>(
        redisCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data())));
    if (r == nullptr || r->type != REDIS_REPLY_ARRAY || r->elements != ids.size()) {
      return absl::UnavailableError(absl::StrCat("redis MGET failed: ", ctx_->errstr));
    }
    return r;
  }

  mutable absl::Mutex mu_;
  redisContext* ctx_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Table> tables_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<RedisServer>> RedisServer::Start() {
  const char* binary = "/usr/bin/redis-server";
  if (access(binary, X_OK) != 0) {
    return absl::FailedPreconditionError(
        "redis-server not found: apt-get install redis-server (scripts/setup.sh does)");
  }
  std::unique_ptr<RedisServer> s(new RedisServer());
  s->port_ = FreePort();
  const std::string port = std::to_string(s->port_);
  // Its banner and log lines are not the benchmark's output.
  s->process_ = std::make_unique<base::LoggedProcess>(
      std::vector<std::string>{binary, "--port", port, "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--loglevel", "warning", "--daemonize", "no"},
      "/dev/null");
  for (int i = 0; i < 100; ++i) {
    redisContext* c = redisConnect("127.0.0.1", s->port_);
    if (c != nullptr && c->err == 0) {
      Reply pong(static_cast<redisReply*>(redisCommand(c, "PING")));
      redisFree(c);
      if (pong != nullptr && pong->type == REDIS_REPLY_STATUS) return s;
    } else if (c != nullptr) {
      redisFree(c);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::UnavailableError(absl::StrCat("redis-server did not start on port ", port));
}

absl::StatusOr<std::unique_ptr<embedding::EmbeddingCollection>> NewRedisCollection(int port) {
  redisContext* c = redisConnect("127.0.0.1", port);
  if (c == nullptr || c->err != 0) {
    const std::string why = c != nullptr ? c->errstr : "out of memory";
    if (c != nullptr) redisFree(c);
    return absl::UnavailableError(
        absl::StrCat("cannot connect to redis on port ", port, ": ", why));
  }
  return std::unique_ptr<embedding::EmbeddingCollection>(new RedisCollection(c));
}

}  // namespace tessera::bench
