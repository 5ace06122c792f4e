#!/usr/bin/env bash
# Debian's chromium for the dashboard's browser test (tests/test_observe_run.py drives it
# with Playwright; never `playwright install`, which downloads its own browser build).
# Idempotent: does nothing when /usr/bin/chromium is there. Installs it with apt-get when
# missing and running as root; otherwise says how. Under CI=true the test fails without it.
set -euo pipefail

if [[ -x /usr/bin/chromium ]]; then
  echo "setup-browser: chromium present ($(/usr/bin/chromium --version 2>/dev/null || echo '?')); nothing to do"
  exit 0
fi
if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null; then
  echo "setup-browser: /usr/bin/chromium is missing and this is not a root Debian shell:" \
       "install it with 'sudo apt-get install chromium' (the browser test skips outside CI)"
  exit 0
fi
echo "setup-browser: installing chromium with apt-get"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium >/dev/null
echo "setup-browser: installed $(/usr/bin/chromium --version 2>/dev/null || echo chromium)"
