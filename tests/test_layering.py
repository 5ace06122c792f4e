"""The one-way arrows between packages: components import only what they run."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _imports(folder: Path) -> set[str]:
    out: set[str] = set()
    for f in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                out.add(node.module)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
    return out


def test_models_do_not_import_rollout_or_the_launcher():
    bad = {m for m in _imports(ROOT / "astraflow" / "models")
           if m.startswith(("astraflow.rollout", "astraflow.local.launcher", "astraflow.train"))}
    assert not bad, f"astraflow/models imports {sorted(bad)}"


def test_trainer_and_worker_do_not_import_the_launcher():
    code = ("import sys; import astraflow.train.trainer, astraflow.train.version0, "
            "astraflow.rollout.worker, astraflow.local.evaluate; "
            "print(sorted(m for m in sys.modules if m in ('astraflow.local.launcher', 'astraflow.local.supervise')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
