#include "server/rendezvous_store.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"

namespace tessera::server {

absl::Status RendezvousStore::CheckKey(const std::string& key) const {
  if (key.empty()) return absl::InvalidArgumentError("rendezvous key must not be empty");
  if (key.size() > limits_.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous key of ", key.size(), " bytes is over the limit of ", limits_.max_key_bytes));
  }
  return absl::OkStatus();
}

absl::Status RendezvousStore::CheckRoom(const std::string& key) const {
  if (values_.size() >= limits_.max_keys && !values_.contains(key)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the rendezvous store holds ", values_.size(),
                     " keys, its limit; restart the coordinator to clear it"));
  }
  return absl::OkStatus();
}

absl::Status RendezvousStore::Set(const std::string& key, std::string value) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  if (value.size() > limits_.max_value_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous value of ", value.size(), " bytes for key '", key,
                     "' is over the limit of ", limits_.max_value_bytes));
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckRoom(key); !s.ok()) return s;
  values_[key] = std::move(value);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> RendezvousStore::Get(const std::vector<std::string>& keys,
                                                              std::chrono::milliseconds timeout) {
  if (keys.empty()) return std::vector<std::string>();
  if (keys.size() > limits_.max_keys) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous get of ", keys.size(), " keys is over the limit of ", limits_.max_keys));
  }
  for (const auto& key : keys) {
    if (absl::Status s = CheckKey(key); !s.ok()) return s;
  }
  timeout = std::clamp(timeout, std::chrono::milliseconds(0), limits_.max_wait);
  struct AllThere {
    const RendezvousStore* store;
    const std::vector<std::string>* keys;
    bool operator()() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
      for (const std::string& k : *keys) {
        if (!store->values_.contains(k)) return false;
      }
      return true;
    }
  } all_there{this, &keys};
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&all_there), absl::FromChrono(timeout))) {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (!values_.contains(k)) missing.push_back(k);
    }
    return absl::DeadlineExceededError(
        absl::StrCat("rendezvous: after ", timeout.count(), " ms still no value for ",
                     missing.size(), " key(s): ",
                     absl::StrJoin(missing.begin(),
                                   missing.begin() + std::min<size_t>(8, missing.size()), ", ")));
  }
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(values_.at(k));
  return out;
}

absl::StatusOr<int64_t> RendezvousStore::Add(const std::string& key, int64_t delta) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckRoom(key); !s.ok()) return s;
  int64_t value = 0;
  auto it = values_.find(key);
  if (it != values_.end() && !absl::SimpleAtoi(it->second, &value)) {
    return absl::FailedPreconditionError(
        absl::StrCat("rendezvous key '", key, "' holds a value that is not a counter"));
  }
  value += delta;
  values_[key] = absl::StrCat(value);
  return value;
}

size_t RendezvousStore::size() const {
  absl::MutexLock lock(&mu_);
  return values_.size();
}

}  // namespace tessera::server
