"""The docs site builds strictly, holds every page, and the README stays a front door.

`mkdocs build --strict` (mkdocs.yml: every validation a warning, so a fatal one here)
fails on a broken link or anchor between pages, a page missing from the nav, or a nav
entry with no page. What the pages name (commands, flags, paths, Python imports) is
checked by tests/test_readme.py, which walks the docs too.
"""

from __future__ import annotations

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
