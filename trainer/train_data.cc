#include "trainer/train_data.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace tessera::trainer {
namespace {

// Each id of `b` taken modulo its feature's vocabulary (--vocabulary=hashed).
void HashIds(const std::vector<int64_t>& vocabulary, Batch* b) {
  for (size_t f = 0; f < vocabulary.size() && f < b->ids.size(); ++f) {
    const uint64_t n = static_cast<uint64_t>(vocabulary[f]);
    for (int64_t& id : b->ids[f]) id = static_cast<int64_t>(static_cast<uint64_t>(id) % n);
  }
}

// A source whose batches' ids are hashed into fixed vocabularies.
class HashedIdsSource : public BatchSource {
 public:
  HashedIdsSource(std::unique_ptr<BatchSource> inner, std::vector<int64_t> vocabulary)
      : inner_(std::move(inner)), vocabulary_(std::move(vocabulary)) {}
  absl::StatusOr<bool> Next(Batch* batch) override {
    TESSERA_ASSIGN_OR_RETURN(const bool more, inner_->Next(batch));
    if (more) HashIds(vocabulary_, batch);
    return more;
  }

 private:
  std::unique_ptr<BatchSource> inner_;
  std::vector<int64_t> vocabulary_;
};

}  // namespace

absl::Status OpenSyntheticData(const TrainFlags& f, TrainData* d) {
  TESSERA_ASSIGN_OR_RETURN(d->generator, SyntheticGenerator::Create(f.synthetic_data));
  const SyntheticGenerator* gen = d->generator.get();
  d->make_source = [gen, &f](int64_t first) -> absl::StatusOr<std::unique_ptr<BatchSource>> {
    // Batch i is a pure function of i: a resumed run starts at its first step's batch.
    // Data-parallel worker w trains batches w, w + N, w + 2N, ...
    const int batch_size = f.batch_size, num_workers = f.num_workers, worker = f.worker;
    return std::unique_ptr<BatchSource>(std::make_unique<ParallelBatchPipeline>(
        [gen, batch_size, first, num_workers, worker](int64_t index, Batch* b) {
          gen->MakeBatch((first + index) * num_workers + worker, batch_size, b);
          return absl::OkStatus();
        },
        std::max<int64_t>(0, f.steps - first), f.reader_threads, f.prefetch));
  };
  d->held_out = d->generator->MakeHeldOut(f.held_out);
  std::printf("data: synthetic, %d dense + %d sparse features, %lld steps of %d, %d held out\n",
              f.model.num_dense, f.model.num_sparse, static_cast<long long>(f.steps), f.batch_size,
              d->held_out.size);
  return absl::OkStatus();
}

absl::Status OpenFileData(const TrainFlags& f, TrainData* d) {
  // The held-out split is read first and alone: the training reader's reports follow
  // its, and with --on_bad_line=stop the first bad line of the file is the one named.
  HeldOutReport held_report;
  TESSERA_ASSIGN_OR_RETURN(d->held_out, CriteoReader::LoadHeldOut(f.data, f.criteo, &held_report));
  TESSERA_ASSIGN_OR_RETURN(d->opened, CriteoReader::Open(f.data, f.criteo, f.batch_size));
  const std::string files = d->opened->paths().size() == 1
                                ? d->opened->paths()[0]
                                : absl::StrCat(d->opened->paths().size(), " files");
  std::printf("data: %s, %d epoch(s), batches of %d, %d held out\n", files.c_str(), f.criteo.epochs,
              f.batch_size, d->held_out.size);
  if (held_report.bad_lines > 0) {
    std::printf("data: skipped %lld malformed held-out line(s) of %lld\n",
                static_cast<long long>(held_report.bad_lines),
                static_cast<long long>(held_report.lines_read));
  }
  d->make_source = [d, &f](int64_t first) -> absl::StatusOr<std::unique_ptr<BatchSource>> {
    std::unique_ptr<CriteoReader> r = std::move(d->opened);
    if (r == nullptr) {
      TESSERA_ASSIGN_OR_RETURN(r, CriteoReader::Open(f.data, f.criteo, f.batch_size));
    }
    d->reader = r.get();
    auto prefetching = std::make_unique<PrefetchingSource>(std::move(r), f.prefetch);
    if (first > 0) {
      // The file is read in order: pass over the batches the checkpoint has seen.
      Batch skipped;
      for (int64_t i = 0; i < first; ++i) {
        TESSERA_ASSIGN_OR_RETURN(bool more, prefetching->Next(&skipped));
        if (!more) break;
      }
      std::printf("resume: skipped the %lld batches before step %lld\n",
                  static_cast<long long>(first), static_cast<long long>(first));
    }
    return std::unique_ptr<BatchSource>(std::move(prefetching));
  };
  return absl::OkStatus();
}

void HashData(const TrainFlags& f, TrainData* d) {
  HashIds(f.vocabulary, &d->held_out);
  auto inner = std::move(d->make_source);
  d->make_source = [inner, &f](int64_t first) -> absl::StatusOr<std::unique_ptr<BatchSource>> {
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<BatchSource> source, inner(first));
    return std::unique_ptr<BatchSource>(
        std::make_unique<HashedIdsSource>(std::move(source), f.vocabulary));
  };
  std::printf(
      "vocabulary: hashed, ids taken modulo each feature's cardinality into "
      "fixed-vocabulary tables\n");
}

}  // namespace tessera::trainer
