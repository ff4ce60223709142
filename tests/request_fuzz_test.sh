#!/usr/bin/env bash
# Runs the request fuzzer (built into build-fuzz/ by scripts/test.sh) for a bounded time
# from the seed corpus. Fails on any crash, leak or sanitizer report; exits 77 (skipped)
# when the fuzzer was not built (no clang).
set -uo pipefail
ROOT="$1"
SECONDS_TO_RUN="${2:-30}"
FUZZER="$ROOT/build-fuzz/server/request_fuzzer"
[ -x "$FUZZER" ] || { echo "request fuzzer not built (scripts/fuzz.sh build): skipped"; exit 77; }
source "$ROOT/tests/sanitized_build.sh"
require_fresh_build "$ROOT"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cp "$ROOT"/tests/fuzz_corpus/* "$WORK/"
"$FUZZER" "$WORK" -max_total_time="$SECONDS_TO_RUN" -rss_limit_mb=2048 -timeout=10 \
  -artifact_prefix="$WORK/finding-" > "$WORK/log" 2>&1
rc=$?
tail -n 3 "$WORK/log"
if [ "$rc" != 0 ]; then
  # The parser's complaints about invalid UTF-8 are not findings: leave them out.
  grep -E "ERROR|SUMMARY|runtime error|Test unit written|^    #[0-9]+ " "$WORK/log" \
    | grep -v "libprotobuf ERROR" | head -40
  for f in "$WORK"/finding-*; do [ -f "$f" ] && { echo "input: $f"; od -A x -t x1z "$f" | head -20; }; done
  exit 1
fi
