#!/usr/bin/env bash
# Sourced by scripts/setup.sh and scripts/test.sh: installs the Debian packages named in
# its arguments that are missing (idempotent; apt-get update only when one is).
install_packages() {
  local missing=() p
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing ${missing[*]}"
    $sudo apt-get update
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
  else
    echo "all $# packages present"
  fi
}
