"""Packaging guards: the package-dir mapping, the bare-import ban, the README and CI.

`stores/` and `policies/` live at the top of the repo but install as
`astraflow.stores` and `astraflow.policies`. That only works if every import
goes through `astraflow.` and the wheel really maps the folders; these tests
check both from outside the checkout, where a bare `stores` folder is not on
the path. They also hold the README's quickstart and `.ci/run` to one command.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
CI_RUN = REPO / ".ci" / "run"

# Source folder -> where its files land in the installed package.
PACKAGE_DIRS = {
    "astraflow": "astraflow",
    "stores": "astraflow/stores",
    "policies": "astraflow/policies",
    "apps": "astraflow/cloud/apps",
}

IMPORT_PROBE = """
import importlib.util, json
import astraflow, astraflow.stores, astraflow.policies
print(json.dumps({
    "astraflow": astraflow.__file__,
    "stores": astraflow.stores.__file__,
    "policies": astraflow.policies.__file__,
    "bare_stores": importlib.util.find_spec("stores") is not None,
    "bare_policies": importlib.util.find_spec("policies") is not None,
}))
"""


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise with its output, so the cause is in the report."""
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if proc.returncode != 0:
        raise AssertionError(
            f"{cmd} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


def _probe_imports(cwd: Path, pythonpath: Path | None) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    proc = _run([sys.executable, "-c", IMPORT_PROBE], cwd=cwd, env=env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _source_modules() -> set[str]:
    """Installed-relative paths of every .py file the three package folders hold."""
    found = set()
    for src, dest in PACKAGE_DIRS.items():
        for path in (REPO / src).rglob("*.py"):
            if "__pycache__" not in path.parts:
                found.add(f"{dest}/{path.relative_to(REPO / src).as_posix()}")
    return found


# --- the wheel and the editable install, imported from outside the checkout ---


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of the checkout, pip-installed (not editable, no
    deps) into a target folder: put it first on PYTHONPATH to run the installed one."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    # Build from a copy so stale build/ or egg-info in the checkout cannot leak in.
    src = tmp_path / "src"
    shutil.copytree(
        REPO,
        src,
        ignore=shutil.ignore_patterns(
            ".git",
            "runs",
            "build",
            "dist",
            "*.egg-info",
            "__pycache__",
            ".venv",
            ".venv-*",
            ".pytest_cache",
            ".ruff_cache",
            "site",
        ),
    )
    wheels = tmp_path / "wheels"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(wheels),
            str(src),
        ]
    )
    (wheel,) = wheels.glob("astraflow-*.whl")

    target = tmp_path / "target"
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)])
    return target


def test_wheel_installs_stores_and_policies_under_astraflow(installed_wheel: Path,
                                                            tmp_path: Path) -> None:
    target = installed_wheel
    top_level = {p.name for p in target.iterdir()}
    unexpected = {
        name
        for name in top_level
        if name not in {"astraflow", "bin"}
        and not (name.startswith("astraflow-") and name.endswith(".dist-info"))
    }
    assert not unexpected, f"the wheel installs top-level names besides astraflow: {unexpected}"

    installed = {
        p.relative_to(target).as_posix()
        for p in (target / "astraflow").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    missing = _source_modules() - installed
    assert not missing, (
        f"modules missing from the wheel: {sorted(missing)}; "
        "add their package to [tool.setuptools] packages in pyproject.toml"
    )

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    found = _probe_imports(cwd=outside, pythonpath=target)
    for name in ("astraflow", "stores", "policies"):
        assert Path(found[name]).resolve().is_relative_to(target.resolve()), (
            f"{name} imported from {found[name]}, not from the installed wheel in {target}"
        )
    assert Path(found["stores"]).parent == target / "astraflow" / "stores"
    assert Path(found["policies"]).parent == target / "astraflow" / "policies"
    assert not found["bare_stores"] and not found["bare_policies"], found


def test_installed_wheel_launches_from_another_directory(installed_wheel: Path,
                                                         tmp_path: Path) -> None:
    """`pip install .` (not editable) then `astraflow launch --dry-run` elsewhere: the
    SkyPilot task files and the Modal app come from the package, not the checkout, and
    with no checkout to upload the tasks install the package on the VM instead."""
    pytest.importorskip("sky")  # the dry run builds the SkyPilot tasks
    target = installed_wheel
    tasks = target / "astraflow" / "cloud" / "tasks"
    assert sorted(p.name for p in tasks.iterdir() if p.suffix == ".yaml") == [
        "rollout.sky.yaml", "train.sky.yaml"]
    assert (target / "astraflow" / "cloud" / "apps" / "rollout.py").is_file()
    assert not (target / "sky").exists() and not (target / "apps").exists()

    shutil.copy(REPO / "examples" / "cloud.yaml", tmp_path / "cloud.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(PYTHONPATH=str(target), ASTRAFLOW_PACKAGE="")
    script = target / "bin" / "astraflow"
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "astraflow"]
    proc = _run([*cmd, "launch", "--dry-run", "cloud.yaml"], cwd=tmp_path, env=env,
                timeout=300)
    out = proc.stdout
    assert f"{tasks / 'train.sky.yaml'}" in out and f"{tasks / 'rollout.sky.yaml'}" in out, out
    assert "dry run: 2 SkyPilot task(s) built and validated; nothing launched" in out, out
    assert f"the VMs install astraflow=={metadata.version('astraflow')}" in out, out
    assert "deployed by modal deploy -m astraflow.cloud.apps.rollout" in out, out

    probe = ("from astraflow.cloud.skypilot import checkout, TRAIN_TASK; "
             "from astraflow.cloud.modal_calls import app_file; "
             "print(checkout(), TRAIN_TASK, app_file())")
    proc = _run([sys.executable, "-c", probe], cwd=tmp_path, env=env)
    assert proc.stdout.split() == ["None", str(tasks / "train.sky.yaml"),
                                   str(target / "astraflow" / "cloud" / "apps" / "rollout.py")]
    # The Modal app deploys from the installed package (`modal deploy -m
    # astraflow.cloud.apps.rollout`): it copies that package into its image, not a checkout.
    pytest.importorskip("modal")
    probe = ("import astraflow.cloud.apps.rollout as a; "
             "print(a.CHECKOUT, a.INSTALLED_PACKAGE, any(r.startswith('vllm') "
             "for r in a.installed_requirements()))")
    proc = _run([sys.executable, "-c", probe], cwd=tmp_path, env=env)
    assert proc.stdout.split() == ["False", str(target / "astraflow"), "True"], proc.stdout


def test_editable_install_maps_stores_and_policies(tmp_path: Path) -> None:
    # A stray astraflow.egg-info in the checkout can shadow the installed metadata.
    urls = [d.read_text("direct_url.json") for d in metadata.distributions(name="astraflow")]
    urls = [json.loads(u) for u in urls if u]
    if not urls:
        pytest.skip("astraflow is not installed with pip")
    direct_url = urls[0]
    if not direct_url.get("dir_info", {}).get("editable"):
        pytest.skip("astraflow is not installed in editable mode")
    if Path(direct_url["url"].removeprefix("file://")).resolve() != REPO:
        pytest.skip(f"the editable install points at {direct_url['url']}, not this checkout")

    found = _probe_imports(cwd=tmp_path, pythonpath=None)
    assert Path(found["astraflow"]).parent == REPO / "astraflow"
    assert Path(found["stores"]).parent == REPO / "stores"
    assert Path(found["policies"]).parent == REPO / "policies"
    assert not found["bare_stores"] and not found["bare_policies"], found


# --- the lint rule that bans bare imports of the mapped folders ---


def _ruff_codes(source: str) -> set[str]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--no-cache",
            "--output-format",
            "json",
            "--stdin-filename",
            str(REPO / "tests" / "_ruff_probe.py"),
            "-",
        ],
        input=source,
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode in (0, 1), f"ruff failed to run:\n{proc.stderr}"
    return {d["code"] for d in json.loads(proc.stdout)}


@pytest.mark.parametrize(
    "source",
    [
        "import stores\n",
        "import policies\n",
        "import stores.trajectories\n",
        "from stores import weights\n",
        "from policies.simulator import simulate\n",
    ],
)
def test_ruff_bans_bare_stores_and_policies(source: str) -> None:
    assert "TID251" in _ruff_codes(source), f"ruff with the project config did not flag {source!r}"


@pytest.mark.parametrize(
    "source",
    [
        "from astraflow import stores\n",
        "from astraflow import policies\n",
        "import astraflow.stores\n",
        "from astraflow.stores import weights\n",
    ],
)
def test_ruff_allows_astraflow_imports(source: str) -> None:
    assert "TID251" not in _ruff_codes(source), f"ruff flagged the correct import {source!r}"


# --- layout ---


def test_sky_folder_is_not_a_package() -> None:
    # `sky` is SkyPilot's import name; a package here would shadow it.
    assert (REPO / "sky").is_dir()
    assert not (REPO / "sky" / "__init__.py").exists(), "sky/ must not have an __init__.py"
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    # It ships only as package data under astraflow (astraflow/cloud/tasks/).
    top = {p.split(".")[0] for p in (*setuptools["packages"], *setuptools["package-dir"])}
    assert top == {"astraflow"}, f"pyproject.toml packages a top-level name besides astraflow: {top}"
    assert setuptools["package-dir"]["astraflow.cloud.tasks"] == "sky"


# --- README quickstart and CI ---


def _quickstart_commands() -> list[str]:
    text = README.read_text()
    match = re.search(r"^## Quickstart\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, "README.md has no '## Quickstart' section"
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", match.group(1), re.M | re.S)
    return [
        line.strip()
        for block in blocks
        for line in block.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def test_readme_quickstart_has_exactly_two_commands() -> None:
    commands = _quickstart_commands()
    assert len(commands) == 2, f"the quickstart must be two commands, found {commands}"
    run_cmd, test_cmd = commands
    assert re.fullmatch(
        r"pip install torch==\S+ -e \. && astraflow run examples/\S+\.yaml", run_cmd
    ), run_cmd
    # The test command installs dev (+ launch for the task-file and Modal tests) and
    # builds the vLLM environment before pytest.
    assert re.fullmatch(r"pip install torch==\S+ -e '\.\[dev(,launch)?\]'"
                        r"( && bash scripts/setup-(vllm|test)-env\.sh)? && python -m pytest.*",
                        test_cmd), test_cmd


def test_readme_torch_pin_fits_pyproject() -> None:
    from packaging.requirements import Requirement

    pins = {m for cmd in _quickstart_commands() for m in re.findall(r"torch==(\S+)", cmd)}
    assert len(pins) == 1, f"both quickstart commands must pin the same torch, found {pins}"
    pyproject = (REPO / "pyproject.toml").read_text()
    spec = re.search(r'^\s*"(torch[^"]*)"', pyproject, re.M)
    assert spec, "pyproject.toml has no torch dependency"
    (pin,) = pins
    assert Requirement(spec.group(1)).specifier.contains(pin), (
        f"torch=={pin} is outside {spec.group(1)}"
    )


def test_readme_names_files_that_exist() -> None:
    text = README.read_text()
    contributing = (REPO / "CONTRIBUTING.md").read_text()
    section = re.search(r"^## Read these files first\n(.*?)(?=^## |\Z)", contributing,
                        re.M | re.S)
    assert section, "CONTRIBUTING.md has no '## Read these files first' section"
    named = re.findall(r"^\d+\. `([^`]+)`", section.group(1), re.M)
    assert len(named) >= 5, named
    named += re.findall(r"astraflow run (examples/\S+\.yaml)", text)
    # A name ending in "/" is a folder (e.g. a package to read whole).
    missing = [path for path in named
               if not ((REPO / path).is_dir() if path.endswith("/") else (REPO / path).is_file())]
    assert not missing, f"README.md names files that do not exist: {missing}"


def test_ci_runs_the_readme_test_command() -> None:
    assert os.access(CI_RUN, os.X_OK), ".ci/run must be executable"
    proc = _run([str(CI_RUN), "--print"])
    assert proc.stdout.strip() == _quickstart_commands()[1]


def _fake_checkout(tmp_path: Path, command: str | None) -> Path:
    """A copy of .ci/run next to a README whose test command is `command`."""
    (tmp_path / ".ci").mkdir()
    shutil.copy2(CI_RUN, tmp_path / ".ci" / "run")
    body = (
        ""
        if command is None
        else f"<!-- test-command -->\n```bash\n{command}\n```\n<!-- /test-command -->\n"
    )
    (tmp_path / "README.md").write_text(f"# Fake\n\n## Quickstart\n\n{body}")
    return tmp_path / ".ci" / "run"


@pytest.mark.parametrize("code", [0, 1, 5])
def test_ci_run_executes_the_command_and_keeps_its_exit_code(tmp_path: Path, code: int) -> None:
    ci = _fake_checkout(tmp_path, f"echo ran > ran.txt && exit {code}")
    proc = subprocess.run([str(ci)], capture_output=True, text=True, cwd="/")
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert (tmp_path / "ran.txt").read_text() == "ran\n", "the command did not run in the repo root"
    assert re.search(r"after \d+m\d\ds", proc.stdout), f"no timing printed:\n{proc.stdout}"
    if code == 5:
        assert "no tests" in proc.stderr


def test_ci_run_stops_at_the_first_failing_part(tmp_path: Path) -> None:
    ci = _fake_checkout(tmp_path, "false && touch reached.txt")
    proc = subprocess.run([str(ci)], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert not (tmp_path / "reached.txt").exists()


@pytest.mark.parametrize("command", [None, "echo one\necho two"])
def test_ci_run_refuses_a_readme_without_one_command(tmp_path: Path, command: str | None) -> None:
    ci = _fake_checkout(tmp_path, command)
    proc = subprocess.run([str(ci)], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "exactly one command" in proc.stderr
