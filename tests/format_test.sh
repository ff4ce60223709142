#!/usr/bin/env bash
# Formatting, as .clang-format says: no line of C++ or CUDA source over its 100 columns
# (the whole tree), and every line changed since the commit in scripts/format_baseline
# formatted as clang-format would (clang-format-diff, which also sorts the includes those
# lines touch). Where the clone lacks that commit (a shallow one), only the columns.
#
#   tests/format_test.sh SOURCE_DIR
set -uo pipefail
ROOT="$1"
cd "$ROOT" || exit 1
DIFF_TOOL=/usr/share/clang/clang-format-14/clang-format-diff.py
if ! command -v clang-format-14 > /dev/null || [ ! -f "$DIFF_TOOL" ]; then
  echo "SKIP: clang-format-14 is not installed (scripts/test.sh installs it)"
  exit 77
fi
if ! git rev-parse --git-dir > /dev/null 2>&1; then
  echo "SKIP: $ROOT is not a git checkout"
  exit 77
fi
status=0
sources() { git ls-files -- '*.cc' '*.h' '*.cu' '*.cuh'; }
long="$(sources | xargs awk 'length > 100 { print FILENAME ":" FNR ": " length " columns" }')"
if [ -n "$long" ]; then
  echo "FAIL: lines over 100 columns:"
  echo "$long"
  status=1
fi
base="$(tr -d '[:space:]' < scripts/format_baseline)"
if git cat-file -e "${base}^{commit}" 2> /dev/null; then
  changes="$(git diff -U0 --no-color "$base" -- '*.cc' '*.h' '*.cu' '*.cuh' \
             | python3 "$DIFF_TOOL" -p1 -binary clang-format-14)"
  if [ -n "$changes" ]; then
    echo "FAIL: lines changed since $base that clang-format would change (apply with:"
    echo "  git diff -U0 $base | $DIFF_TOOL -p1 -i -binary clang-format-14):"
    echo "$changes"
    status=1
  fi
else
  echo "note: $base is not in this clone's history: changed lines not checked"
fi
[ "$status" -eq 0 ] && echo "format: ok"
exit "$status"
