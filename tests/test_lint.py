"""The whole tree passes ruff with the project's config (imports, bans, style)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed; install the dev extra: pip install -e '.[dev]'")
    r = subprocess.run([ruff, "check", "--no-cache", str(REPO)], capture_output=True, text=True,
                       cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_help_is_fast_and_light():
    """`astraflow --help` must not import torch or lancedb (thin entry point)."""
    code = ("import sys; from astraflow.cli.app import app; "
            "assert 'torch' not in sys.modules and 'lancedb' not in sys.modules, "
            "[m for m in ('torch', 'lancedb') if m in sys.modules]")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
