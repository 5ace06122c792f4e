#!/usr/bin/env bash
# The verifiers environment: verifiers 0.4 + astraflow (editable) in its own venv,
# apart from the main env (verifiers needs uvicorn >= 0.52, SkyPilot in `launch` pins
# uvicorn < 0.36). Used by tests/test_env_verifiers.py and by rollout workers of a flow
# whose env is `verifiers`:
#   bash scripts/setup-verifiers-env.sh && .venv-verifiers/bin/astraflow rollout RUN
#
# Idempotent: does nothing when the env already imports verifiers and this checkout's
# astraflow. ASTRAFLOW_VERIFIERS_ENV sets the location (default: <repo>/.venv-verifiers);
# ASTRAFLOW_VERIFIERS_BASE_PYTHON the interpreter that creates it (default: python3;
# tested: 3.11).
set -euo pipefail

TORCH_VERSION=2.13.0   # the CPU wheel on CPU machines (pip's find-links), as .venv-vllm

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
env_dir="${ASTRAFLOW_VERIFIERS_ENV:-$root/.venv-verifiers}"
py="$env_dir/bin/python"
start=$SECONDS

ready() {
  [[ -x "$py" ]] && "$py" - "$root" <<'PY' >/dev/null 2>&1
import pathlib, sys
import verifiers  # noqa: F401
import astraflow
# astraflow must be this checkout's (an env made from another clone would test that one)
sys.exit(pathlib.Path(astraflow.__file__).resolve().parent.parent != pathlib.Path(sys.argv[1]).resolve())
PY
}

if ready; then
  echo "verifiers env ready at $env_dir (nothing to do, $((SECONDS - start)) s)"
  exit 0
fi

echo "setting up the verifiers env at $env_dir (torch $TORCH_VERSION)"
[[ -x "$py" ]] || "${ASTRAFLOW_VERIFIERS_BASE_PYTHON:-python3}" -m venv "$env_dir"
# One resolve: torch, astraflow's dependencies and the `verifiers` extra (pytest too,
# so the verifiers-side test helpers can run in this env).
"$py" -m pip install --quiet "torch==$TORCH_VERSION" -e "$root[verifiers]" "pytest>=8"

if ! ready; then
  echo "the verifiers env at $env_dir does not import verifiers and this checkout's astraflow" >&2
  "$py" -c 'import verifiers, astraflow; print(astraflow.__file__)' >&2 || true
  exit 1
fi
"$py" -c 'import torch, verifiers; print(f"verifiers {verifiers.__version__}, torch {torch.__version__}")'
echo "verifiers env ready at $env_dir in $((SECONDS - start)) s"
