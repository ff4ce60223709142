#include "base/process_settings.h"

#include "absl/synchronization/mutex.h"

namespace tessera::base {

void DisableMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace tessera::base
