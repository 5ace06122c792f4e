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

The docs site's pages (`docs/**/*.md`) and CONTRIBUTING.md are walked the same way: their
commands, their repository paths, their Python blocks. A page may also name a module by
its place inside the package (`envs/sandbox.py`, `data/replay.py`): such a path must exist
under `astraflow/`. A Markdown link resolves from its page's folder. The README's "Extend it" snippets are written into a package and run: the
stage on a table, the workflow on a batch, the env through the runtime's own checks, the
scaling policy in the simulator.
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
DOCS = sorted((REPO / "docs").rglob("*.md"))
PAGES = [README, REPO / "CONTRIBUTING.md", *DOCS]
CLI = [sys.executable, "-m", "astraflow"]
CLOUD_TOOLS = {"sky", "modal", "export", "aws", "gcloud"}
OFFLINE = {"check", "flow-reference"}
PATH_RE = re.compile(r"(?<![\w./~-])((?:examples|benchmarks|sky|apps|scripts|docs|tests|policies|stores|"
                     r"astraflow)/[\w./-]*\w)")
#: The runtime's subpackages: a doc may name `envs/base.py` for `astraflow/envs/base.py`.
SUBPACKAGES = ("config", "cli", "local", "cloud", "models", "rollout", "workflows", "envs",
               "train", "data", "observe", "scale")
LINK_RE = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")
IN_PACKAGE_RE = re.compile(rf"(?<![\w./~-])((?:{'|'.join(SUBPACKAGES)})/[\w./-]*\.py)\b")


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


def _page(path: Path) -> str:
    return str(path.relative_to(REPO))


def _commands(pages: list[Path] = PAGES) -> list[tuple[list[str], str, str]]:
    """(argv, comment, the line) for every command of every bash block of the README
    and the docs; a block whose first line is a comment about a cloud marks all of its
    commands."""
    cmds = []
    for block in (b for page in pages for b in _blocks(page.read_text())):
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
    readme = [a for a in _commands([README]) if _without_env(a[0])[:1] == ["astraflow"]]
    assert len(readme) >= 5, "the README lost its astraflow commands"
    assert len(ASTRAFLOW) >= 25, "the docs lost their astraflow commands"


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


@pytest.mark.parametrize("page", PAGES, ids=_page)
def test_paths_named_in_the_readme_and_docs_exist(page):
    """Markdown link targets (`[x](benchmarks/store.md)`) from the page's own folder, as a
    browser and MkDocs resolve them; other repository paths (`examples/…`, `astraflow/…`,
    `docs/…`) from the repository root, wherever the page lies; in-package paths
    (`envs/sandbox.py`) under `astraflow/`. Placeholders (`<policy>`, `*`) name no file."""
    text = page.read_text()
    links = [t for t in LINK_RE.findall(text) if not re.match(r"[a-z]+://|mailto:", t)]
    missing = sorted(t for t in links if not (page.parent / t).exists())
    text = LINK_RE.sub("]()", text)
    named = {p for p in PATH_RE.findall(text) if "<" not in p and "*" not in p}
    missing += sorted(p for p in named if not (REPO / p).exists())
    in_package = set(IN_PACKAGE_RE.findall(text))
    missing += sorted(p for p in in_package if not (REPO / "astraflow" / p).exists())
    assert not missing, f"{_page(page)} names paths that do not exist: {missing}"


DOTTED_RE = re.compile(r"`(astraflow(?:\.\w+)+(?::\w+)?)")


def _resolves(dotted: str) -> bool:
    """`astraflow.envs.code:CodeEnv` or `astraflow.context.RunContext.open`: the longest
    importable module prefix, then attributes."""
    import importlib

    parts = dotted.replace(":", ".").split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=_page)
def test_dotted_names_in_the_readme_and_docs_resolve(page):
    """A doc that names `astraflow.x.y` (a module, a class, `module:attr`) names something
    that imports: a name that moved fails here instead of misleading a reader."""
    broken = sorted({d for d in DOTTED_RE.findall(page.read_text()) if not _resolves(d)})
    assert not broken, f"{_page(page)} names what does not import: {broken}"


def test_the_readme_indexes_every_docs_guide():
    text = README.read_text()
    guides = [p for p in DOCS if p.parent == REPO / "docs"]
    assert len(guides) >= 9, guides
    unlinked = [_page(p) for p in guides if f"]({_page(p)})" not in text]
    assert not unlinked, f"the README's docs index does not link {unlinked}"
    assert "](docs/benchmarks/index.md)" in text


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.M | re.S)


@pytest.mark.parametrize("page", [p for p in PAGES if _python_blocks(p)], ids=_page)
def test_python_blocks_compile_and_import_what_they_name(page):
    import ast
    import importlib

    for block in _python_blocks(page):
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                mod = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(mod, alias.name), f"{node.module} has no {alias.name}"


def test_the_readme_and_docs_keep_their_python_examples():
    assert len(_python_blocks(README)) >= 4, "the README lost its extension snippets"
    assert any("run_local" in b for p in DOCS for b in _python_blocks(p)), \
        "the docs lost the Python API example"


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


# -- the README's "Extend it" snippets, run as the user's package ----------------------
@pytest.fixture
def mypkg(tmp_path, monkeypatch):
    """The README's `# mypkg/<module>.py` blocks written as a package on sys.path."""
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    written = []
    for block in _python_blocks(README):
        m = re.match(r"# (mypkg/\w+\.py)\b", block)
        if m:
            (tmp_path / m.group(1)).write_text(block)
            written.append(m.group(1))
    assert sorted(written) == ["mypkg/envs.py", "mypkg/flows.py", "mypkg/scaling.py",
                               "mypkg/stages.py"], written
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
        del sys.modules[name]


def test_the_readme_stage_drops_and_counts(mypkg):
    import pyarrow as pa

    from astraflow.data.stages import StageContext, run_stages

    rows = pa.table({"completion_ids": [[1] * 10, [1] * 100, [1] * 64],
                     "reward": pa.array([1.0, 0.0, 1.0], pa.float32())})
    out = run_stages(rows, StageContext("solver", 3, 3),
                     [("mypkg.stages:drop_long", {"max_tokens": 64})])
    assert out.rows.num_rows == 2 and out.dropped == {"too_long": 1}


def test_the_readme_workflow_plays_a_batch(mypkg):
    import random

    from astraflow import registry
    from astraflow.envs.math import MathEnv
    from astraflow.models.tokenizer import CharCodec
    from astraflow.rollout.generation import Generation
    from astraflow.workflows.base import Workflow

    cls = registry.resolve("workflow", "mypkg.flows:Brief")
    assert issubclass(cls, Workflow)
    codec, env = CharCodec.default(), MathEnv(digits=2)
    flow = cls(env, codec, samples_per_prompt=2)
    tasks = [env.sample(random.Random(0))]
    right = codec.encode(tasks[0].answer) + [codec.eos_id]

    class Actor:
        def generate(self, role, prompts, *, samples, max_new_tokens):
            both = [right, right + right]  # two samples: the answer, and it twice
            return Generation(both, [[0.0] * len(c) for c in both], ["stop", "stop"])

        def env_wait(self):
            pass

    parts = flow.episodes(tasks, Actor())
    plain = env.reward(tasks[0], codec.decode(right))
    assert plain == 1.0
    assert [p.reward for p in parts] == pytest.approx(
        [plain - 0.01 * len(right), env.reward(tasks[0], codec.decode(right + right))
         - 0.02 * len(right)])


def test_the_readme_env_passes_the_runtime_checks(mypkg):
    import random

    from astraflow.envs import build_env

    env = build_env("mypkg.envs:Reverse", {"length": 4})
    rng = random.Random(1)
    train = {env.sample(rng).task_id for _ in range(300)}
    held = env.eval_tasks(20)
    assert held == env.eval_tasks(20) and not train & {t.task_id for t in held}
    task = held[0]
    (turn,) = env.demonstration(task, rng)
    assert env.reward(task, turn.text.removeprefix("<answer>").removesuffix("</answer>")) == 1.0


def test_the_readme_scaling_policy_runs_in_the_simulator(mypkg):
    from astraflow.policies import Policy, Pool, Scenario, Workload, simulate
    from astraflow.registry import make_policy

    policy = make_policy("mypkg.scaling:Greedy")
    assert isinstance(policy, Policy)
    pools = (Pool("spot", spot=True, price_per_hour=0.4, rows_per_s=8.0),
             Pool("od", price_per_hour=0.8, rows_per_s=8.0))
    run = simulate(Scenario("readme", Workload(steps=30), pools), policy)
    assert run.rollout_cost > 0
