"""The one-way arrows between packages: components import only what they run."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _imports(folder: Path) -> set[str]:
    """Every module imported anywhere in `folder` (lazy and TYPE_CHECKING ones too),
    relative imports resolved to their absolute names."""
    out: set[str] = set()
    for f in folder.rglob("*.py"):
        package = ".".join(f.relative_to(ROOT).with_suffix("").parts[:-1])
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    anchor = ".".join(parts[: len(parts) - (node.level - 1)])
                    base = f"{anchor}.{base}" if base else anchor
                out.add(base)
                out.update(f"{base}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
    return out


def _bad(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(m for m in _imports(ROOT / "astraflow" / package)
                  if any(m == f or m.startswith(f + ".") for f in forbidden))


def test_models_do_not_import_rollout_or_the_launcher():
    bad = _bad("models", ("astraflow.rollout", "astraflow.local", "astraflow.train"))
    assert not bad, f"astraflow/models imports {bad}"


#: Each component package and what it must never import: the arrows point from the
#: processes (launcher, CLI) to the trainer and workers, from those to workflows and
#: models, and envs stand alone (an env knows nothing of models or how it is played).
ARROWS = {
    "models": ("astraflow.rollout", "astraflow.train", "astraflow.workflows",
               "astraflow.local", "astraflow.cli", "astraflow.cloud"),
    "envs": ("astraflow.models", "astraflow.rollout", "astraflow.train", "astraflow.workflows",
             "astraflow.config", "astraflow.local", "astraflow.cli", "astraflow.cloud"),
    "workflows": ("astraflow.train", "astraflow.local", "astraflow.cli", "astraflow.cloud"),
    "rollout": ("astraflow.train", "astraflow.local", "astraflow.cli", "astraflow.cloud"),
    "train": ("astraflow.local", "astraflow.cli", "astraflow.cloud"),
}


@pytest.mark.parametrize("package", sorted(ARROWS))
def test_component_packages_import_only_downward(package):
    bad = _bad(package, ARROWS[package])
    assert not bad, f"astraflow/{package} imports {bad}"


def test_the_step_does_not_know_its_fsdp_implementation():
    """The trainer picks a Step (astraflow.train.step) from its ranks: the plain step
    and the protocol import nothing of FSDP2, so the sharded step swaps in from outside."""
    tree = ast.parse((ROOT / "astraflow" / "train" / "step.py").read_text())
    names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in names if m and ("fsdp" in m or m.startswith("torch.distributed"))}


def test_trainer_and_worker_do_not_import_the_launcher():
    code = ("import sys; import astraflow.train.trainer, astraflow.train.version0, "
            "astraflow.rollout.worker, astraflow.local.evaluate; "
            "print(sorted(m for m in sys.modules if m in ('astraflow.local.launcher', "
            "'astraflow.local.supervise', 'astraflow.local.zygote', 'astraflow.cli.app')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
