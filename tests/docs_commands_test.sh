#!/usr/bin/env bash
# The commands the docs give run Debian's interpreter: a `python3` found first on PATH (a
# virtualenv's, conda's) may lack python3-grpcio and python3-numpy. Fails naming each line
# that runs a script with a bare `python3`.
set -uo pipefail
ROOT="$1"
bad="$(grep -nE '(^|[[:space:]`=])python3 [^-]*\.py' "$ROOT"/README.md "$ROOT"/docs/*.md \
         "$ROOT"/examples/python/*.py "$ROOT"/python/tests/*.py 2>/dev/null \
       | grep -v '/usr/bin/python3' || true)"
if [ -n "$bad" ]; then
  echo "FAIL: commands that run a bare python3 (use /usr/bin/python3):"
  echo "$bad"
  exit 1
fi
echo "docs commands: ok"
