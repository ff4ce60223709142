#ifndef TESSERA_BASE_PROCESS_SETTINGS_H_
#define TESSERA_BASE_PROCESS_SETTINGS_H_

namespace tessera::base {

// Debian's abseil is built with absl::Mutex deadlock detection on: every Lock() then looks
// the mutex up in a global graph, about 2000 instructions, which a batch pays for each of
// its 64 stripe locks. Tables lock one stripe at a time (eviction only TryLocks a second),
// so the detector has nothing to find. Binaries turn it off for their process in main()
// through ParseCommandLine (tests keep it on, where it can catch a mistake).
void DisableMutexDeadlockDetection();

}  // namespace tessera::base

#endif  // TESSERA_BASE_PROCESS_SETTINGS_H_
