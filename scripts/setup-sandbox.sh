#!/usr/bin/env bash
# Installs what astraflow/envs/sandbox.py runs programs with: bubblewrap (`bwrap`) and
# util-linux's `prlimit`, from Debian's packages. Idempotent: does nothing when both
# are there. CI runs it before the tests (the code workload's sandbox tests need it).
set -euo pipefail
if command -v bwrap >/dev/null && command -v prlimit >/dev/null && [[ -x /usr/bin/python3 || -x /usr/local/bin/python3 ]]; then
  exit 0
fi
sudo_=""; [[ "$(id -u)" -ne 0 ]] && sudo_="sudo"
$sudo_ apt-get update -qq
$sudo_ apt-get install -y -qq bubblewrap util-linux python3-minimal
