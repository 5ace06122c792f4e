"""The docs site builds strictly, holds every page, and the README stays a front door.

`mkdocs build --strict` (mkdocs.yml: every validation a warning, so a fatal one here)
fails on a broken link or anchor between pages, a page missing from the nav, or a nav
entry with no page. What the pages name (commands, flags, paths, Python imports) is
checked by tests/test_readme.py, which walks the docs too. CONTRIBUTING.md's module map
(which package may import which) is checked against the source here.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


def _nav_pages(nav) -> list[str]:
    pages = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_mkdocs_builds_strictly(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(site)], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr[-3000:]}"
    assert (site / "index.html").is_file()
    assert (site / "benchmarks" / "index.html").is_file()
    assert "held-out" in (site / "running" / "index.html").read_text()


def test_the_nav_holds_every_page_and_the_guides_the_issue_asks_for():
    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    assert config["theme"]["name"] == "material"
    nav = _nav_pages(config["nav"])
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(nav) == on_disk, "mkdocs.yml's nav and docs/ disagree"
    for guide in ("index.md", "models.md", "agents.md", "store.md", "cloud.md", "scaling.md",
                  "observe.md", "flow.md", "benchmarks/index.md"):
        assert guide in nav, guide


def test_the_readme_is_a_front_door():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250, "README.md is over 250 lines: move detail to docs/"
    headings = re.findall(r"^## (.+)$", text, re.M)
    for needed in ("Status", "Quickstart", "Concepts", "Run it", "Extend it", "Observe",
                   "Layout", "Docs"):
        assert needed in headings, f"README.md lost its {needed} section"


# -- CONTRIBUTING.md's module map, checked against the source --------------------------
SOURCES = {"astraflow": "astraflow", "stores": "astraflow.stores",
           "policies": "astraflow.policies"}


def _map() -> dict[str, set[str] | None]:
    """package (`stores/`, `registry.py`, …) → what it may import (None: anything): whole
    packages (`config/`) or single modules of one (`rollout/generation.py`)."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w./]+)` \| .*? \| (.+?) \|$", section, re.M)
    assert len(rows) >= 15, rows
    names = {pkg.rstrip("/").removesuffix(".py"): pkg for pkg, _ in rows}
    out: dict[str, set[str] | None] = {}
    for pkg, allowed in rows:
        if allowed.startswith("nothing of ours"):
            out[pkg] = set()
        elif allowed == "anything":
            out[pkg] = None
        elif allowed.startswith("anything but "):
            but = re.split(r",\s*|\s+and\s+", allowed.removeprefix("anything but "))
            out[pkg] = set(names.values()) - {pkg, *(names[b] for b in but)}
        else:
            out[pkg] = {names.get(n.strip(), n.strip().strip("`"))
                        for n in allowed.split(",")}
    return out


def _allowed(target: str, allowed: set[str]) -> bool:
    """Whether module `target` (`astraflow.rollout.generation.Generation`, possibly with
    the imported name on the end) lies in what `allowed` names."""
    if _package(target) in allowed:
        return True
    path = "/".join(target.split(".")[1:])
    return any(a.endswith(".py") and (path + "/").startswith(a.removesuffix(".py") + "/")
               for a in allowed)


def _package(module: str) -> str | None:
    """`astraflow.rollout.worker` → `rollout/`; `astraflow.context` → `context.py`;
    `astraflow.stores.weights` → `stores/`; None for what the map leaves out."""
    parts = module.split(".")
    if parts[0] != "astraflow" or len(parts) < 2:
        return None
    if parts[1] in ("stores", "policies") or (REPO / "astraflow" / parts[1]).is_dir():
        return f"{parts[1]}/"
    return f"{parts[1]}.py"


def _imports_by_package() -> dict[str, set[tuple[str, str]]]:
    """package → (imported package, where) for every import of ours, lazy ones too;
    `if TYPE_CHECKING:` blocks are exempt."""
    out: dict[str, set[tuple[str, str]]] = {}
    for top, dotted in SOURCES.items():
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO).with_suffix("")
            module = ".".join([*dotted.split("."), *rel.parts[1:]])
            owner = _package(module) if top == "astraflow" else f"{top}/"
            if owner is None:
                continue
            tree = ast.parse(path.read_text())
            skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                    and "TYPE_CHECKING" in ast.unparse(node.test)
                    for stmt in node.body for n in ast.walk(stmt)}
            for node in ast.walk(tree):
                if id(node) in skip:
                    continue
                if isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:  # relative: from the importing module's package
                        parts = module.split(".")[: -1 if path.name != "__init__.py" else None]
                        anchor = ".".join(parts[: len(parts) - (node.level - 1)])
                        base = f"{anchor}.{base}" if base else anchor
                    targets = [f"{base}.{a.name}" for a in node.names]
                elif isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                else:
                    continue
                for target in targets:
                    pkg = _package(target)
                    if pkg and pkg != owner:
                        out.setdefault(owner, set()).add((target, f"{rel}.py:{node.lineno}"))
    return out


def test_the_module_map_names_every_package():
    mapped = set(_map())
    on_disk = {f"{p.name}/" for p in (REPO / "astraflow").iterdir()
               if p.is_dir() and (p / "__init__.py").exists()}
    on_disk |= {"stores/", "policies/"}
    on_disk |= {p.name for p in (REPO / "astraflow").glob("*.py")} - {
        "__init__.py", "__main__.py", "testing.py"}
    assert on_disk <= mapped, f"CONTRIBUTING.md's module map lacks {sorted(on_disk - mapped)}"
    assert not mapped - on_disk, f"the module map names {sorted(mapped - on_disk)}, not on disk"


def test_imports_follow_the_module_map():
    allowed, found = _map(), _imports_by_package()
    wrong = sorted(f"{owner} imports {target} ({where})"
                   for owner, edges in found.items() if allowed.get(owner) is not None
                   for target, where in edges
                   if _package(target) in allowed and not _allowed(target, allowed[owner]))
    assert not wrong, "imports against CONTRIBUTING.md's module map:\n" + "\n".join(wrong)
