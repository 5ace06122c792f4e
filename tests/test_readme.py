"""Walk the README as a newcomer would: every command it shows must exist and be right.

Each shell line of a fenced `bash` block is split into commands (`&&`, `;`). Then:
  * `astraflow SUB …`: SUB is a command of the CLI, every `--flag` is one of SUB's
    options, and every repository path it names exists. Commands that answer offline
    (`--help`, `--dry-run`, `check`, `flow-reference`) are run here and must succeed;
    a flow named by `astraflow run`/`launch` must pass `astraflow check`. A command
    that needs a cloud account says so in a trailing `# … cloud …` comment; it is
    checked the same way but not run.
  * `python benchmarks/X.py --flag`: the script exists and its source defines the flag.
  * `bash scripts/X.sh`, `pip install … '.[extras]'`: the script and the extras exist.
  * `sky …`, `modal …`, `export …`: cloud tools and settings; the line must be marked
    as needing a cloud, or be part of a block whose first line is such a comment.
  * A command whose own argument is an `s3://` store needs that bucket: checked, not run.
Paths named anywhere in the README's prose as `examples/…`, `benchmarks/…`, `sky/…`,
`apps/…`, `scripts/…` or `docs/…` must exist too.
"""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
CLI = [sys.executable, "-m", "astraflow"]
CLOUD_TOOLS = {"sky", "modal", "export", "aws", "gcloud"}
OFFLINE = {"check", "flow-reference"}
PATH_RE = re.compile(r"(?<![\w./~-])((?:examples|benchmarks|sky|apps|scripts|docs|tests|policies|stores|"
                     r"astraflow)/[\w./-]*\w)")


def _blocks(text: str) -> list[str]:
    return re.findall(r"^```(?:bash|sh|shell)\n(.*?)^```", text, re.M | re.S)


def _lines(block: str) -> list[tuple[str, str]]:
    """(command text, trailing comment) per logical line, continuations joined."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in block.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        line = buf + line
        buf = ""
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        code, _, comment = line.partition(" #")
        out.append((code.strip(), comment.strip()))
    return out


def _commands() -> list[tuple[list[str], str, str]]:
    """(argv, comment, the line) for every command of every bash block; a block whose
    first line is a comment about a cloud marks all of its commands."""
    cmds = []
    for block in _blocks(README.read_text()):
        first = block.strip().splitlines()[0] if block.strip() else ""
        marked = first.startswith("#") and "cloud" in first.lower()
        for code, comment in _lines(block):
            comment = comment + " (cloud block)" if marked else comment
            for part in re.split(r"\s*(?:&&|;)\s*", code):
                if part:
                    cmds.append((shlex.split(part), comment, code))
    return cmds


@functools.cache
def _help(sub: tuple[str, ...]) -> str:
    proc = subprocess.run([*CLI, *sub, "--help"], capture_output=True, text=True, cwd=REPO,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "TERM": "dumb"})
    assert proc.returncode == 0, f"`astraflow {' '.join(sub)} --help` failed: {proc.stderr[-500:]}"
    return proc.stdout


def _subcommand(argv: list[str]) -> tuple[str, ...]:
    """The CLI command an argv names: one word, or two for a group (`models import`)."""
    first = argv[1]
    if f"{first} [OPTIONS] COMMAND" in _help((first,)) if not first.startswith("-") else False:
        return (first, argv[2])
    return (first,)


def _is_cloud(comment: str) -> bool:
    return "cloud" in comment.lower()


def _needs_bucket(argv: list[str]) -> bool:
    """A command whose own argument is an s3:// store needs that bucket and its keys (an
    `--set store.uri=s3://…` of a dry run does not: nothing is read from it)."""
    return any(a.startswith("s3://") and argv[i - 1] != "--set" for i, a in enumerate(argv))


def _without_env(argv: list[str]) -> list[str]:
    """The command after its leading `NAME=value` environment settings
    (`PYTHONPATH=. astraflow scale …` is checked as `astraflow scale …`)."""
    i = 0
    while i < len(argv) and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[i]):
        i += 1
    return argv[i:]


ASTRAFLOW = [(a, c, line) for a, c, line in ((_without_env(a), c, ln) for a, c, ln in _commands())
             if a and a[0] == "astraflow"]


def test_the_readme_shows_commands():
    assert len(ASTRAFLOW) >= 5, "the README lost its astraflow commands"


@pytest.mark.parametrize("argv,comment,line", ASTRAFLOW, ids=[ln[:60] for _, _, ln in ASTRAFLOW])
def test_astraflow_commands_exist_with_their_flags(argv, comment, line):
    if argv[1] in ("--help", "-h"):
        return
    sub = _subcommand(argv)
    text = _help(sub)
    for flag in [a.split("=", 1)[0] for a in argv if a.startswith("--")]:
        if flag == "--help":
            continue
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), \
            f"`{line}`: astraflow {' '.join(sub)} has no option {flag}"
    for path in PATH_RE.findall(" ".join(argv)):
        assert (REPO / path).exists(), f"`{line}` names {path}, which does not exist"


@pytest.mark.parametrize("argv,comment,line", ASTRAFLOW, ids=[ln[:60] for _, _, ln in ASTRAFLOW])
def test_offline_commands_run_and_flows_check(argv, comment, line, tmp_path):
    sub = argv[1]
    if _is_cloud(comment) or _needs_bucket(argv):
        return
    if "--help" in argv or sub in OFFLINE or "--dry-run" in argv:
        proc = subprocess.run([*CLI, *argv[1:]], capture_output=True, text=True, cwd=REPO)
        assert proc.returncode == 0, f"`{line}` failed offline: {proc.stderr[-800:]}"
    flows = [a for a in argv[2:] if a.endswith((".yaml", ".yml")) and a.startswith("examples/")]
    if sub in ("run", "launch") and flows:
        sets = [a for a in argv if a.startswith("--set")]
        values = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
        extra = [x for v in values for x in ("--set", v)] + [
            x for s in sets if "=" in s and s.startswith("--set=") for x in ("--set", s[6:])]
        proc = subprocess.run([*CLI, "check", flows[0], *extra], capture_output=True, text=True,
                              cwd=REPO)
        assert proc.returncode == 0, f"`{line}`: its flow does not check: {proc.stderr[-800:]}"


def test_other_commands_name_real_scripts_extras_and_mark_clouds():
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
                 ["optional-dependencies"])
    for argv, comment, line in _commands():
        tool = argv[0]
        if tool == "python" and len(argv) > 1 and argv[1].startswith("benchmarks/"):
            script = REPO / argv[1]
            assert script.is_file(), f"`{line}`: no {argv[1]}"
            source = script.read_text()
            for flag in [a.split("=", 1)[0] for a in argv[2:] if a.startswith("--")]:
                assert flag in source, f"`{line}`: {argv[1]} has no option {flag}"
        elif tool == "bash":
            assert (REPO / argv[1]).is_file(), f"`{line}`: no {argv[1]}"
        elif tool == "pip" and "install" in argv:
            for arg in argv:
                m = re.fullmatch(r"\.\[([\w,-]+)\]", arg)
                if m:
                    missing = set(m.group(1).split(",")) - extras
                    assert not missing, f"`{line}`: pyproject.toml has no extra {missing}"
        elif tool in CLOUD_TOOLS:
            assert _is_cloud(comment), \
                f"`{line}` needs a cloud account: say so in a trailing `# … cloud …` comment"


def test_paths_named_in_the_readme_exist():
    text = README.read_text()
    named = set(PATH_RE.findall(text))
    missing = sorted(p for p in named if not (REPO / p).exists() and "<" not in p
                     and "*" not in p)
    assert not missing, f"README.md names paths that do not exist: {missing}"


def test_python_blocks_compile_and_import_what_they_name():
    import ast
    import importlib

    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.M | re.S)
    assert blocks, "the README lost its Python API example"
    for block in blocks:
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                mod = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(mod, alias.name), f"{node.module} has no {alias.name}"


def test_every_layout_entry_exists():
    """The README's Layout block: each top-level entry (`astraflow/`, `stores/`, …) and each
    entry indented under a folder (`  flow.py`, `  rollout/`, `  launch.py, cloud.py`) is a
    real path; entries that are only prose (after two spaces of description) are ignored."""
    text = README.read_text()
    section = re.search(r"^## Layout\n\n```\n(.*?)^```", text, re.M | re.S)
    assert section, "README.md has no Layout block"
    parent: str | None = None
    checked = []
    for line in section.group(1).splitlines():
        if not line.strip() or line.startswith(" " * 6):  # a description's continuation
            continue
        names = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        top = not line.startswith(" ")
        for name in (n.strip() for n in names.split(",")):
            if not re.fullmatch(r"[\w.-]+/?", name):
                continue
            path = name if top else f"{parent}{name}"
            checked.append(path)
            assert (REPO / path).exists(), f"README layout names {path}, which does not exist"
        if top:
            parent = names.strip() if names.strip().endswith("/") else None
    assert len(checked) >= 20, checked
