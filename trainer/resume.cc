#include "trainer/resume.h"

#include <chrono>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace tessera::trainer {

std::string EncodeResumeOffer(const ResumeOffer& offer) {
  std::string out(1, static_cast<char>(offer.kind));
  switch (offer.kind) {
    case ResumeOffer::Kind::kRestored:
      out.append(reinterpret_cast<const char*>(&offer.step), sizeof(offer.step));
      out += offer.dense_state;
      break;
    case ResumeOffer::Kind::kRefused:
      out += offer.reason;
      break;
    case ResumeOffer::Kind::kFresh:
      break;
  }
  return out;
}

absl::StatusOr<ResumeOffer> DecodeResumeOffer(absl::string_view bytes) {
  const absl::Status malformed =
      absl::InternalError("resume: worker 0 sent a malformed checkpoint state");
  if (bytes.empty()) return malformed;
  ResumeOffer offer;
  offer.kind = static_cast<ResumeOffer::Kind>(bytes[0]);
  const absl::string_view rest = bytes.substr(1);
  switch (offer.kind) {
    case ResumeOffer::Kind::kRestored:
      if (rest.size() < sizeof(offer.step)) return malformed;
      std::memcpy(&offer.step, rest.data(), sizeof(offer.step));
      offer.dense_state = std::string(rest.substr(sizeof(offer.step)));
      return offer;
    case ResumeOffer::Kind::kRefused:
      offer.reason = std::string(rest);
      return offer;
    case ResumeOffer::Kind::kFresh:
      if (!rest.empty()) return malformed;
      return offer;
  }
  return malformed;
}

namespace {

// Worker 0's (or a single trainer's) resume: what it restored, or why it must not go on.
absl::StatusOr<ResumeOffer> ResumeHere(Trainer& trainer, DenseBackend* dense,
                                       const std::string& model) {
  ResumeOffer offer;
  absl::StatusOr<int64_t> resumed = trainer.Resume();
  if (resumed.ok()) {
    std::printf("resume: restored checkpoint %lld of model '%s'\n",
                static_cast<long long>(*resumed), model.c_str());
    offer.kind = ResumeOffer::Kind::kRestored;
    offer.step = *resumed;
    offer.dense_state = dense->SaveState();
    return offer;
  }
  if (!absl::IsNotFound(resumed.status())) {
    return Annotate(resumed.status(),
                    "resume refused (nothing was restored); pass the flags of the run that wrote "
                    "the checkpoint, or train another --model");
  }
  // Without a checkpoint there is no dense network to go with trained rows: refuse rather
  // than train a fresh one over them.
  TESSERA_ASSIGN_OR_RETURN(const std::string trained, trainer.TrainedTables());
  if (!trained.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("model '", model,
                     "' has no complete checkpoint, but its tables hold trained rows: ", trained,
                     ". Resuming would train a new dense network over them. To start over, drop "
                     "the model's tables (tessera-cli drop --model=",
                     model,
                     ", or delete the --data_dir of "
                     "an in-process run) and run again; or train another --model"));
  }
  std::printf(
      "resume: model '%s' has no complete checkpoint yet and its tables are "
      "untouched; starting at step 0\n",
      model.c_str());
  offer.kind = ResumeOffer::Kind::kFresh;
  return offer;
}

}  // namespace

absl::StatusOr<int64_t> ResumeOnEveryWorker(Trainer& trainer, DenseBackend* dense, DataParallel* dp,
                                            const std::string& model) {
  const int worker = dp != nullptr ? dp->rank() : 0;
  std::string sent;
  absl::Status refused;
  if (worker == 0) {
    absl::StatusOr<ResumeOffer> mine = ResumeHere(trainer, dense, model);
    if (dp == nullptr || dp->size() == 1) {
      if (!mine.ok()) return mine.status();
      return mine->step;
    }
    if (!mine.ok()) {
      refused = mine.status();
      mine = ResumeOffer{ResumeOffer::Kind::kRefused, 0, "", refused.ToString()};
    }
    sent = EncodeResumeOffer(*mine);
  }
  TESSERA_RETURN_IF_ERROR(Annotate(dp->Broadcast(&sent, 0, std::chrono::minutes(30)),
                                   "waiting for worker 0 to restore the checkpoint"));
  if (!refused.ok()) return refused;
  TESSERA_ASSIGN_OR_RETURN(const ResumeOffer offer, DecodeResumeOffer(sent));
  if (offer.kind == ResumeOffer::Kind::kRefused) {
    return absl::FailedPreconditionError(absl::StrCat("worker 0 could not resume: ", offer.reason));
  }
  if (worker != 0 && offer.kind == ResumeOffer::Kind::kRestored) {
    TESSERA_RETURN_IF_ERROR(
        Annotate(dense->LoadState(offer.dense_state),
                 absl::StrCat("the dense state of checkpoint ", offer.step, " from worker 0")));
    std::printf("resume: took checkpoint %lld of model '%s' from worker 0\n",
                static_cast<long long>(offer.step), model.c_str());
  }
  // Every worker must now hold the same step and dense model.
  const uint64_t held[2] = {static_cast<uint64_t>(offer.step), Fingerprint(dense->Parameters())};
  TESSERA_RETURN_IF_ERROR(SameOnEveryWorker(
      dp, std::string(reinterpret_cast<const char*>(held), sizeof(held)), [](int w) {
        return absl::StrCat("resume: worker ", w,
                            " holds another step or dense state than worker 0");
      }));
  return offer.step;
}

absl::Status SameOnEveryWorker(DataParallel* dp, const std::string& mine,
                               const std::function<std::string(int worker)>& differs) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::string> all, dp->AllGather(mine));
  for (int w = 0; w < dp->size(); ++w) {
    if (all[w] != all[0]) return absl::InternalError(differs(w));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> CheckSameDenseModel(DataParallel* dp, DenseBackend* dense) {
  const uint64_t mine = Fingerprint(dense->Parameters());
  TESSERA_RETURN_IF_ERROR(SameOnEveryWorker(
      dp, std::string(reinterpret_cast<const char*>(&mine), sizeof(mine)), [](int w) {
        return absl::StrCat("data-parallel: worker ", w,
                            "'s dense parameters differ from worker 0's");
      }));
  return mine;
}

}  // namespace tessera::trainer
