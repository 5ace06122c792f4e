"""The SkyPilot task files (sky/*.sky.yaml), checked offline with SkyPilot's own code.

Each file must pass SkyPilot's task and resources schemas and load with
`sky.Task.from_yaml`: spot, an `any_of` of several placements, job recovery,
the store as a required env, the bucket keys as secrets with no value, and a
`run:` that ends in one `astraflow` command. The `run:` scripts are executed
with a stub `astraflow` to see the exact argv a worker or trainer gets.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SKY_DIR = REPO / "sky"
TASK_FILES = sorted(SKY_DIR.glob("*.sky.yaml"))
STORE = "s3://test-bucket/runs/x"

sky = pytest.importorskip("sky", reason="SkyPilot is the launch extra: pip install -e '.[launch]'")
from sky.utils import common_utils, schemas  # noqa: E402


def _config(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_task_files_exist_and_sky_is_no_package():
    assert {p.name for p in TASK_FILES} >= {"train.sky.yaml", "rollout.sky.yaml"}
    # `sky` is SkyPilot's import name: an __init__.py here would shadow it.
    assert not (SKY_DIR / "__init__.py").exists()


@pytest.mark.parametrize("path", TASK_FILES, ids=lambda p: p.name)
def test_task_file_passes_skypilot_schema(path):
    config = _config(path)
    common_utils.validate_schema(config, schemas.get_task_schema(), "Invalid task YAML: ")
    common_utils.validate_schema(config["resources"], schemas.get_resources_schema(),
                                 "Invalid resources YAML: ")


@pytest.mark.parametrize("path", TASK_FILES, ids=lambda p: p.name)
def test_task_file_loads_with_skypilot(path):
    # Without the store SkyPilot refuses the file, naming the variable (it is required)...
    with pytest.raises(ValueError, match="ASTRAFLOW_STORE"):
        sky.Task.from_yaml(str(path))
    # ...and with it (what `--env ASTRAFLOW_STORE=...` does) the file is a task.
    text = path.read_text().replace("ASTRAFLOW_STORE:  #", f"ASTRAFLOW_STORE: {STORE}  #")
    task = sky.Task.from_yaml_str(text)
    assert task.envs["ASTRAFLOW_STORE"] == STORE
    resources = list(task.resources)
    if path.name == "train.sky.yaml":
        # A CPU VM: GPUs are added (by `astraflow launch` or --gpus) only for a trainer
        # that uses them; one node unless the launch says more.
        assert task.num_nodes == 1 and len(resources) == 1
        assert resources[0].cpus == "8+" and not resources[0].accelerators
    else:
        assert len(resources) == len(_config(path)["resources"]["any_of"]) >= 3
    for r in resources:
        assert r.use_spot
        assert path.name == "train.sky.yaml" or (
            r.accelerators and all(n == 1 for n in r.accelerators.values()))
        assert r.job_recovery["strategy"] == "EAGER_NEXT_REGION"
        assert r.job_recovery["max_restarts_on_errors"] >= 1
    # Bucket keys are secrets without a value in the file: --secret must supply them.
    assert {s.name for s in task.managed_secret_refs} == {"AWS_ACCESS_KEY_ID",
                                                          "AWS_SECRET_ACCESS_KEY"}
    assert not task.secrets
    assert task.workdir == "."
    assert "pip install -e ." in task.setup or "pip install -e '.[" in task.setup


@pytest.mark.parametrize("path", TASK_FILES, ids=lambda p: p.name)
def test_run_is_one_astraflow_command(path):
    lines = [ln.strip() for ln in _config(path)["run"].strip().splitlines()]
    calls = [ln for ln in lines if re.search(r"(^|\s)astraflow\s", ln)]
    assert calls == [lines[-1]], lines
    # The trainer's may be prefixed by its torchrun launcher (empty for one process).
    argv = shlex.split(lines[-1].removeprefix("exec ").removeprefix('"${LAUNCHER[@]}" '))
    assert argv[0] == "astraflow" and argv[1] in ("train", "rollout")
    assert argv[2] == "$ASTRAFLOW_STORE"


@pytest.mark.parametrize("path", TASK_FILES, ids=lambda p: p.name)
def test_usage_header_matches_the_file(path):
    """The header's `sky jobs launch` line names this file and only envs it declares."""
    header = "\n".join(ln for ln in path.read_text().splitlines() if ln.startswith("#"))
    assert f"sky jobs launch sky/{path.name}" in header
    assert "--secret AWS_ACCESS_KEY_ID --secret AWS_SECRET_ACCESS_KEY" in header
    declared = set(_config(path)["envs"])
    used = set(re.findall(r"--env ([A-Z_]+)=", header))
    assert "ASTRAFLOW_STORE" in used
    assert used - declared <= {"AWS_ENDPOINT_URL", "AWS_REGION"}, used - declared


@pytest.mark.parametrize("path", TASK_FILES, ids=lambda p: p.name)
def test_scripts_are_valid_bash(path):
    config = _config(path)
    for key in ("setup", "run"):
        r = subprocess.run(["bash", "-n"], input=config[key], capture_output=True, text=True)
        assert r.returncode == 0, f"{key}: {r.stderr}"


_STUB = """#!{python}
import json, os, sys
print(json.dumps({{"prog": os.path.basename(sys.argv[0]), "argv": sys.argv[1:],
                   "env": {{k: v for k, v in os.environ.items() if k.startswith("SKYPILOT_")}}}}))
"""


def _run_script(path: Path, tmp_path: Path, env: dict[str, str], *,
                full: bool = False) -> list[str] | dict:
    """Run the file's `run:` with stub `astraflow` and `torchrun` programs (first on PATH)
    that print what they were started with as JSON: the argv of `astraflow` (or, with
    `full`, {prog, argv, env} of whichever program the script exec'd)."""
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    for prog in ("astraflow", "torchrun"):
        stub = venv / prog
        stub.write_text(_STUB.format(python=sys.executable))
        stub.chmod(0o755)
    (venv / "activate").write_text(f'export PATH="{venv}:$PATH"\n')
    script = _config(path)["run"].replace("~/astraflow-venv", str(venv.parent))
    declared = {k: str(v) for k, v in _config(path)["envs"].items() if v is not None}
    environ = {"PATH": os.environ["PATH"], **declared, "ASTRAFLOW_STORE": STORE, **env}
    r = subprocess.run(["bash", "-c", script], env=environ, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    if full:
        return out
    assert out["prog"] == "astraflow", out
    return out["argv"]


def test_rollout_worker_ids_and_region(tmp_path):
    path = SKY_DIR / "rollout.sky.yaml"
    info = json.dumps({"cluster_name": "c", "cloud": "AWS", "region": "us-west-2", "zone": None})
    # A managed job: id from the job, region from where SkyPilot placed the VM.
    argv = _run_script(path, tmp_path / "a", {
        "ASTRAFLOW_POOL": "east", "ASTRAFLOW_MINUTES": "45", "SKYPILOT_MANAGED_JOB_ID": "17",
        "SKYPILOT_TASK_ID": "sky-managed-2025_x_17-0", "SKYPILOT_NODE_RANK": "0",
        "SKYPILOT_CLUSTER_INFO": info})
    assert argv == ["rollout", STORE, "--worker-id", "east-17-0", "--minutes", "45",
                    "--region", "us-west-2"]
    # A multi-node cluster (`sky launch --num-nodes`): one id per node; an explicit
    # ASTRAFLOW_REGION wins; no region known: no --region at all.
    ids = set()
    for rank in ("0", "1"):
        argv = _run_script(path, tmp_path / f"b{rank}", {
            "SKYPILOT_TASK_ID": "sky-2025_rollouts_3", "SKYPILOT_NODE_RANK": rank,
            "SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": "GCP", "region": None})})
        assert "--region" not in argv
        ids.add(argv[argv.index("--worker-id") + 1])
    assert len(ids) == 2 and all(re.fullmatch(r"sky-[0-9a-f]{8}-[01]", i) for i in ids), ids
    argv = _run_script(path, tmp_path / "c", {"ASTRAFLOW_REGION": "eu-west-1",
                                              "SKYPILOT_TASK_ID": "t", "SKYPILOT_NODE_RANK": "0",
                                              "SKYPILOT_CLUSTER_INFO": info})
    assert argv[-2:] == ["--region", "eu-west-1"]


def test_trainer_command(tmp_path):
    path = SKY_DIR / "train.sky.yaml"
    assert _run_script(path, tmp_path / "a", {"POLICY": "verifier"}) == [
        "train", STORE, "--policy", "verifier"]
    assert _run_script(path, tmp_path / "b", {}) == ["train", STORE]  # one-policy flow


def _rendezvous(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """torchrun's options (`--name value` pairs up to --no-python) and the command after."""
    cut = argv.index("--no-python")
    opts = argv[:cut]
    assert len(opts) % 2 == 0 and all(o.startswith("--") for o in opts[::2]), opts
    return dict(zip(opts[::2], opts[1::2], strict=True)), argv[cut + 1:]


def test_trainer_rendezvous_one_node(tmp_path):
    """One node: one GPU (or a CPU VM) runs astraflow alone; several GPUs run torchrun
    with one rank per GPU."""
    path = SKY_DIR / "train.sky.yaml"
    sky_env = {"SKYPILOT_NODE_IPS": "10.0.0.5", "SKYPILOT_NODE_RANK": "0",
               "SKYPILOT_NUM_NODES": "1", "POLICY": "solver"}
    for gpus in ("1", "0"):
        out = _run_script(path, tmp_path / f"g{gpus}", {**sky_env,
                                                        "SKYPILOT_NUM_GPUS_PER_NODE": gpus},
                          full=True)
        assert out["prog"] == "astraflow" and out["argv"] == ["train", STORE, "--policy", "solver"]
    out = _run_script(path, tmp_path / "g4", {**sky_env, "SKYPILOT_NUM_GPUS_PER_NODE": "4"},
                      full=True)
    assert out["prog"] == "torchrun"
    opts, command = _rendezvous(out["argv"])
    assert opts == {"--nnodes": "1", "--node-rank": "0", "--nproc-per-node": "4",
                    "--master-addr": "10.0.0.5", "--master-port": "29500"}
    assert command == ["astraflow", "train", STORE, "--policy", "solver"]
    assert out["env"]["SKYPILOT_NODE_RANK"] == "0"  # torchrun sees SkyPilot's environment


def test_trainer_rendezvous_two_nodes(tmp_path):
    """Two nodes of 8 GPUs: both start torchrun against node 0's IP (the first line of
    SKYPILOT_NODE_IPS) on the same port, each with its own node rank."""
    path = SKY_DIR / "train.sky.yaml"
    seen = {}
    for rank in ("0", "1"):
        out = _run_script(path, tmp_path / rank, {
            "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6\n", "SKYPILOT_NODE_RANK": rank,
            "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NUM_GPUS_PER_NODE": "8", "POLICY": "verifier",
            "ASTRAFLOW_MASTER_PORT": "29611"}, full=True)
        assert out["prog"] == "torchrun"
        opts, command = _rendezvous(out["argv"])
        seen[rank] = opts
        assert command == ["astraflow", "train", STORE, "--policy", "verifier"]
    for rank, opts in seen.items():
        assert opts == {"--nnodes": "2", "--node-rank": rank, "--nproc-per-node": "8",
                        "--master-addr": "10.0.0.5", "--master-port": "29611"}
    # CPU nodes (no GPUs): one process each, still a 2-node rendezvous; one-policy flow.
    out = _run_script(path, tmp_path / "cpu", {
        "SKYPILOT_NODE_IPS": "10.0.0.7\n10.0.0.8", "SKYPILOT_NODE_RANK": "1",
        "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NUM_GPUS_PER_NODE": "0"}, full=True)
    opts, command = _rendezvous(out["argv"])
    assert opts == {"--nnodes": "2", "--node-rank": "1", "--nproc-per-node": "1",
                    "--master-addr": "10.0.0.7", "--master-port": "29500"}
    assert command == ["astraflow", "train", STORE]
    # ASTRAFLOW_NPROC_PER_NODE overrides the GPU count (e.g. CPU ranks per node).
    out = _run_script(path, tmp_path / "np", {
        "SKYPILOT_NODE_IPS": "10.0.0.7", "SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "1",
        "SKYPILOT_NUM_GPUS_PER_NODE": "0", "ASTRAFLOW_NPROC_PER_NODE": "2"}, full=True)
    assert _rendezvous(out["argv"])[0]["--nproc-per-node"] == "2"


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c.update(rnu=c.pop("run")), "rnu"),
    (lambda c: c["resources"].update(use_spots=True), "use_spots"),
    (lambda c: c["resources"].setdefault("any_of", []).append({"accelerators": "L4:1",
                                                               "spot": True}), "spot"),
    (lambda c: c["envs"].update({"BAD-NAME": "x"}), "envs"),
])
def test_broken_task_file_is_rejected(tmp_path, mutate, message):
    """The same validator fails on a broken file, so the checks above can fail."""
    config = _config(SKY_DIR / "train.sky.yaml")
    config["envs"]["ASTRAFLOW_STORE"] = STORE
    mutate(config)
    broken = tmp_path / "broken.sky.yaml"
    broken.write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match=message):
        sky.Task.from_yaml(str(broken))


# A few rows of SkyPilot's AWS catalog (real instance types and columns; prices
# are illustrative). SkyPilot reads ~/.sky/catalogs/v8/aws/vms.csv and fetches it
# only when the file is missing or stale, so a fresh fixture keeps it offline.
_AWS_VMS = """\
InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone,Arch
g6.xlarge,L4,1.0,4.0,16.0,"{'Gpus': [{'Name': 'L4', 'Manufacturer': 'NVIDIA', 'Count': 1, 'MemoryInfo': {'SizeInMiB': 22888}}], 'TotalGpuMemoryInMiB': 22888}",0.8048,0.3,us-east-1,use1-az1,x86_64
g6.xlarge,L4,1.0,4.0,16.0,"{'Gpus': [{'Name': 'L4', 'Manufacturer': 'NVIDIA', 'Count': 1, 'MemoryInfo': {'SizeInMiB': 22888}}], 'TotalGpuMemoryInMiB': 22888}",0.8048,0.31,us-west-2,usw2-az1,x86_64
g5.xlarge,A10G,1.0,4.0,16.0,"{'Gpus': [{'Name': 'A10G', 'Manufacturer': 'NVIDIA', 'Count': 1, 'MemoryInfo': {'SizeInMiB': 24576}}], 'TotalGpuMemoryInMiB': 24576}",1.006,0.4,us-east-1,use1-az2,x86_64
g5.xlarge,A10G,1.0,4.0,16.0,"{'Gpus': [{'Name': 'A10G', 'Manufacturer': 'NVIDIA', 'Count': 1, 'MemoryInfo': {'SizeInMiB': 24576}}], 'TotalGpuMemoryInMiB': 24576}",1.006,0.42,us-west-2,usw2-az2,x86_64
"""

_RESOLVE = """
import json, sys
from sky import catalog
out = {}
for infra, acc in json.loads(sys.argv[1]):
    cloud, _, region = infra.partition("/")
    name, count = acc.split(":")
    types, _fuzzy = catalog.get_instance_type_for_accelerator(
        name, int(count), use_spot=True, clouds=cloud, region=region or None)
    out[f"{infra} {acc}"] = types
print(json.dumps(out))
"""


def test_aws_placements_resolve_against_a_catalog(tmp_path):
    """Every AWS placement of the rollout task file and of examples/cloud.yaml's sky pool
    names an accelerator and region SkyPilot's catalog resolves to a spot instance type."""
    aws = tmp_path / ".sky" / "catalogs" / "v8" / "aws"
    aws.mkdir(parents=True)
    (aws / "vms.csv").write_text(_AWS_VMS)
    env = {**os.environ, "HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    env.pop("SKY_RUNTIME_DIR", None)
    from astraflow.cloud.plan import plan
    from astraflow.config.loader import load_flow

    wanted = [(e["infra"], e["accelerators"]) for j in plan(load_flow(REPO / "examples" /
                                                                      "cloud.yaml")).pools
              for e in j.any_of]
    task = sky.Task.from_yaml_str((SKY_DIR / "rollout.sky.yaml").read_text().replace(
        "ASTRAFLOW_STORE:  #", f"ASTRAFLOW_STORE: {STORE}  #"))
    wanted += [("aws", f"{n}:{c}") for r in task.resources if str(r.infra.cloud) == "AWS"
               for n, c in r.accelerators.items()]
    # The catalog lives under $HOME, read when sky.catalog is imported: a fresh process.
    r = subprocess.run([sys.executable, "-c", _RESOLVE, json.dumps(wanted)],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    resolved = json.loads(r.stdout.strip().splitlines()[-1])
    assert {"aws/us-east-1 L4:1", "aws/us-west-2 A10G:1", "aws L4:1", "aws A10G:1"} <= set(resolved)
    assert all(resolved.values()), resolved
    assert resolved["aws/us-west-2 L4:1"] == ["g6.xlarge"]
