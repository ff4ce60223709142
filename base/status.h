#ifndef TESSERA_BASE_STATUS_H_
#define TESSERA_BASE_STATUS_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tessera {

// Returns `status` with `context` put in front of its message, keeping its code and
// payloads. An OK status stays OK.
inline absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  absl::Status out(status.code(), absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

// A push refused with `status` that has nevertheless updated some rows (the others kept
// their values): the caller must not apply it again. Marked with a payload.
inline constexpr absl::string_view kPartlyAppliedPayload = "tessera/partly-applied";
inline absl::Status PartlyApplied(absl::Status status) {
  status.SetPayload(kPartlyAppliedPayload, absl::Cord("1"));
  return status;
}
inline bool IsPartlyApplied(const absl::Status& status) {
  return status.GetPayload(kPartlyAppliedPayload).has_value();
}
// For callers that apply several parts and go on past a partly applied one: OK when
// `status` is partly applied (kept in *first unless it holds one already), else `status`.
inline absl::Status SetAsidePartlyApplied(absl::Status status, absl::Status* first) {
  if (!IsPartlyApplied(status)) return status;
  if (first->ok()) *first = std::move(status);
  return absl::OkStatus();
}

// Why a run failed, where what to do next depends on it and not on the status code alone:
// set by the layer that knows (a data-parallel partner that is missing, an input file that
// is damaged) and read by the program that advises (tessera-train's "next:" line), so that
// no advice hangs on a message's words. A payload: Annotate keeps it.
enum class Cause { kNone, kWorker, kInputFile };
inline constexpr absl::string_view kCausePayload = "tessera/cause";
inline absl::Status WithCause(absl::Status status, Cause cause) {
  if (status.ok() || cause == Cause::kNone) return status;
  status.SetPayload(kCausePayload, absl::Cord(cause == Cause::kWorker ? "worker" : "input-file"));
  return status;
}
inline Cause CauseOf(const absl::Status& status) {
  const auto cause = status.GetPayload(kCausePayload);
  if (!cause.has_value()) return Cause::kNone;
  if (*cause == "worker") return Cause::kWorker;
  if (*cause == "input-file") return Cause::kInputFile;
  return Cause::kNone;
}

// FailedPrecondition from a part that a build without CUDA lacks (TESSERA_CUDA=OFF, or AUTO
// where nvcc was not found): names `what` and how to get a build that has it, on a
// machine where `needs` are installed.
inline absl::Status NotBuiltWithoutCuda(absl::string_view what, absl::string_view needs) {
  return absl::FailedPreconditionError(
      absl::StrCat("this build has no ", what,
                   ": configure with -DTESSERA_CUDA=AUTO (the default) or ON on a machine where ",
                   needs, " are installed"));
}

}  // namespace tessera

#define TESSERA_STATUS_CONCAT_INNER_(a, b) a##b
#define TESSERA_STATUS_CONCAT_(a, b) TESSERA_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the caller when it is not OK.
#define TESSERA_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::absl::Status tessera_status_ = (expr);           \
    if (!tessera_status_.ok()) return tessera_status_; \
  } while (false)

// `lhs = value of expr` where expr is an absl::StatusOr<T>; returns the error otherwise.
#define TESSERA_ASSIGN_OR_RETURN(lhs, expr) \
  TESSERA_ASSIGN_OR_RETURN_IMPL_(TESSERA_STATUS_CONCAT_(tessera_statusor_, __LINE__), lhs, expr)

#define TESSERA_ASSIGN_OR_RETURN_IMPL_(var, lhs, expr) \
  auto var = (expr);                                   \
  if (!var.ok()) return std::move(var).status();       \
  lhs = std::move(var).value()

#endif  // TESSERA_BASE_STATUS_H_
