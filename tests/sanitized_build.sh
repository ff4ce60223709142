#!/usr/bin/env bash
# Sourced by the tests that run the sanitized tree (build-fuzz/): the state of the source
# tree a build was made from, and a check that build-fuzz/ was made from the tree as it is
# now, so that a tree edited since is not reported as tested by binaries of before.
#
#   source_state ROOT       prints the git tree of the tracked files as they are (committed
#                           or not: files tests leave are not counted); nothing outside git
#   require_fresh_build ROOT   exits 77 (skipped), saying why, when build-fuzz/ is stale

source_state() {
  local root="$1" index
  index="$(git -C "$root" rev-parse --path-format=absolute --git-path index 2> /dev/null)" ||
    return 0
  local scratch
  scratch="$(mktemp)"
  # A copy of the index, so that only files changed since it are hashed again.
  cp "$index" "$scratch" 2> /dev/null || true
  GIT_INDEX_FILE="$scratch" git -C "$root" add -u . 2> /dev/null &&
    GIT_INDEX_FILE="$scratch" git -C "$root" write-tree 2> /dev/null
  rm -f "$scratch"
}

require_fresh_build() {
  local root="$1" stamp="$1/build-fuzz/source-state"
  [ -f "$stamp" ] || return 0  # built before stamps existed, or outside git: nothing to compare
  if [ "$(source_state "$root")" != "$(cat "$stamp")" ]; then
    echo "build-fuzz/ was built from another state of the source tree (the tree changed since):"
    echo "scripts/fuzz.sh build brings it up to date; skipped"
    exit 77
  fi
}
