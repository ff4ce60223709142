#ifndef TESSERA_BASE_CHECK_H_
#define TESSERA_BASE_CHECK_H_

// TESSERA_DCHECK(condition): an invariant that a layer trusts because a layer above it
// checked it (a programmer's error if it fails, never a user's). Aborts with the condition
// and its place in debug builds; compiled out with NDEBUG (release builds), where the
// check was already made once at the edge. Debian's abseil predates ABSL_DCHECK.

#include <cassert>

#define TESSERA_DCHECK(condition) assert(condition)

#endif  // TESSERA_BASE_CHECK_H_
