"""Version 0 of each policy: where every weight stream starts.

    tiny policy:  fresh tiny Llama ──warm start (supervised, on the workflow's demos)──► v0
    hf policy:    the pretrained model itself (warm start only if asked) ─────────────► v0
    init_from:    another policy's v0 (its weights and tokenizer) ──(warm start)──────► v0

The launcher calls this before starting any component; a trainer started alone
(a cloud trainer) calls it for its own policy. A trainer with `algorithm.kl_coef`
anchors to version 0 (`reference_model`). It lives with the trainer, not
the launcher, so `astraflow train` never imports the local launcher.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from astraflow.context import RunContext
from astraflow.models.codec import load_codec
from astraflow.models.factory import build_model
from astraflow.models.hf import carried_files, load_policy, save_policy
from astraflow.models.hf import source_files as model_source_files
from astraflow.models.weights import load_weights_into
from astraflow.stores import WeightError
from astraflow.train.warm_start import warm_start
from astraflow.workflows.workload import make_workflow

if TYPE_CHECKING:
    import torch

    from astraflow.config.flow import PolicySpec
    from astraflow.config.model import ModelSpec
    from astraflow.train.dist import Ranks


def ensure_imported(spec: ModelSpec, console: Console) -> None:
    """Import `spec.import_from` (a GGUF file or the package shipping one) into
    `spec.path` when that folder does not exist yet."""
    if spec.import_from is None or spec.path is None or Path(spec.path).exists():
        return
    from astraflow.models.gguf_import import import_gguf

    console.print(f"importing {spec.import_from} into {spec.path} (once; see `astraflow models "
                  f"import`)")

    @contextmanager
    def step(what: str) -> Iterator[None]:
        t0 = time.time()
        console.print(f"  {what}…")
        yield
        console.print(f"  {what}: {time.time() - t0:.0f}s")

    import_gguf(spec.import_from, spec.path, step=step)


def publish_version0(ctx: RunContext, console: Console, policies: list[str] | None = None,
                     *, wait_s: float = 3600.0) -> dict[str, Any]:
    """Make and publish version 0 of each policy (or those in `policies`); a policy that
    already has weights is skipped. Returns per-policy warm-start figures.

    A policy initialised from another (`warm_start.init_from`) waits up to `wait_s`
    for that one's version 0, which its own trainer may still be making."""
    out: dict[str, Any] = {}
    ws = ctx.weights()
    for name in policies or ctx.flow.policy_names():
        if (have := ws.latest(name)) is not None:
            console.print(f"[dim]weights of {name} exist (v{have}); skipping version 0")
            continue
        pol = ctx.flow.policy_spec(name)
        source = pol.warm_start.init_from
        deadline = time.time() + wait_s
        while source is not None and ws.latest(source) is None:
            if time.time() > deadline:
                raise WeightError(f"{name} starts from {source} v0, which did not appear in "
                                  f"{wait_s:.0f}s: start {source}'s trainer")
            console.print(f"[dim]{name}: waiting for {source} v0 (warm_start.init_from)")
            time.sleep(10.0)
        role = ctx.flow.role_of(name)
        t0 = time.time()
        if pol.model.kind == "hf":
            ensure_imported(pol.model, console)
            console.print(f"loading {name}'s pretrained model from {pol.model.path} "
                          f"(dtype {pol.model.dtype})")
        model = build_model(pol.model, seed=ctx.flow.seed)
        if source is None:
            files = model_source_files(pol.model)
        else:  # its weights and the tokenizer files they came with
            src_dir = ws.load(source, 0)
            load_weights_into(model, src_dir)
            files = carried_files(src_dir)
        # The workflow encodes with the tokenizer this version will carry.
        with tempfile.TemporaryDirectory(prefix="astraflow-codec-") as tmp:
            for fname, data in files.items():
                (Path(tmp) / fname).write_bytes(data)
            codec = load_codec(tmp)
        workflow = make_workflow(ctx.flow, codec)
        metric = workflow.metric_name(role)
        src = f" from {source} v0" if source else ""
        res = None
        if pol.warm_start.max_steps == 0:
            what = (f"the pretrained model {pol.model.path}" if pol.model.kind == "hf"
                    else src.strip() or "the random initialisation")
            console.print(f"version 0 of {name} ({role}) is {what} as it is "
                          f"(warm_start.max_steps: 0)")
        else:
            console.print(f"warm start of {name} as {role}{src}: supervised pass until validation "
                          f"{metric} >= {pol.warm_start.target_accuracy:.0%} (at most "
                          f"{pol.warm_start.max_steps} steps)")

            def progress(step: int, acc: float, pol=pol, metric=metric) -> None:
                if step % 100 == 0 or acc >= pol.warm_start.target_accuracy:
                    console.print(f"  warm start step {step}: validation {metric} {acc:.1%}")

            res = warm_start(model, codec, workflow, role, pol.warm_start, seed=ctx.flow.seed,
                             progress=progress)
        staging = ws.staging_dir(name)
        save_policy(model, staging, source=files)
        ws.publish(name, staging, step=0, version=0)
        took = time.time() - t0
        if res is None:
            console.print(f"published {name} v0 in {took:.0f}s")
            out[name] = {"steps": 0, "seconds": took, "validation_accuracy": None}
        else:
            console.print(f"published {name} v0 after {res.steps} steps, {res.seconds:.0f}s "
                          f"(validation {metric} {res.accuracy:.1%})")
            out[name] = {"steps": res.steps, "seconds": res.seconds,
                         "validation_accuracy": res.accuracy}
    return out


def reference_model(ctx: RunContext, spec: PolicySpec, ranks: Ranks,
                    versions: list[int]) -> torch.nn.Module | None:
    """`algorithm.kl_coef` > 0: a frozen copy of version 0 (the policy's starting
    point; never pruned), in eval mode without grad, on the policy's device and in
    its dtype. Loaded afresh on every trainer start (it holds no state). For a LoRA
    policy it is the full model version 0 holds (base, plus its adapter merged if any).
    On FSDP2 ranks every rank holds it whole (not sharded: it runs no collective, only
    the rank's own rows), so it costs one full copy of the weights per rank."""
    if spec.algorithm.kl_coef <= 0:
        return None
    if 0 not in versions:
        raise RuntimeError(
            f"policies.{spec.name}.algorithm.kl_coef > 0 anchors to version 0, which "
            f"is not in {ctx.weights_root}")
    ref = load_policy(ctx.weights().load(spec.name, 0), dtype=spec.model.dtype)
    ref.requires_grad_(False)
    ref.eval()
    if ranks.device.type != "cpu":
        ref.to(ranks.device)
    return ref
