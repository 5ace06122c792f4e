"""`astraflow rollout`, `train` and `eval`: one component of a run, started by hand, by the
local supervisor or on a cloud machine; each stops cleanly on SIGTERM."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from astraflow.cli.common import RunTarget, check_engine, fail, open_run

app = typer.Typer()


@app.command()
def rollout(
    run_dir: RunTarget,
    worker_id: Annotated[str, typer.Option(help="name of this worker in rows and logs")] = "w0",
    max_batches: Annotated[int | None, typer.Option(help="stop after this many batches")] = None,
    minutes: Annotated[float | None, typer.Option(help="stop after this many minutes")] = None,
    region: Annotated[str | None, typer.Option(help="read weights from this region's replica "
                                                    "(store.replicas); default $ASTRAFLOW_REGION"
                                              )] = None,
) -> None:
    """Run one rollout worker against a run's store until stopped (with
    `rollout.endpoint`: serve the OpenAI-compatible API for an agent instead)."""
    ctx = open_run(run_dir, "rollout-" + worker_id)
    check_engine(ctx.flow.rollout.engine)
    import time

    from astraflow.local.supervise import stop_flag
    from astraflow.rollout.worker import RolloutWorker

    stop = stop_flag()
    deadline = time.time() + minutes * 60 if minutes else None
    if ctx.flow.rollout.endpoint is not None:  # the agent plays the episodes
        from astraflow.rollout.serving import Refused, Served

        try:
            Served(ctx, worker_id, region=region).run(should_stop=stop, deadline=deadline)
        except Refused as err:
            fail(str(err))
        return
    RolloutWorker(ctx, worker_id, region=region).run(max_batches=max_batches, deadline=deadline,
                                      should_stop=stop)


@app.command()
def train(
    run_dir: RunTarget,
    policy: Annotated[str | None, typer.Option(help="the policy to train (required when the "
                                                   "flow has several)")] = None,
    mode: Annotated[str | None, typer.Option(help="async: this policy's trainer; sync: the "
                                                 "trainer-centred baseline, driving a worker "
                                                 "and every policy's trainer in lockstep "
                                                 "(default: the run's flow mode)")] = None,
    max_steps: Annotated[int | None, typer.Option(help="override stop.max_steps")] = None,
    shared_base: Annotated[str | None, typer.Option(
        help="train every policy whose model.shared_base is this name, as adapters on one "
             "copy of the base in this process (instead of --policy)")] = None,
) -> None:
    """Run one policy's trainer, or those of the policies sharing a base (resumes from
    the newest checkpoints; SIGTERM checkpoints)."""
    if mode not in (None, "async", "sync"):
        fail(f"--mode takes async or sync, got {mode!r}")
    name = shared_base if policy is None else policy
    ctx = open_run(run_dir, "sync" if mode == "sync" else f"trainer-{name or 'main'}")
    sync = (mode or ctx.flow.mode) == "sync"
    if max_steps is not None:
        ctx.flow.stop.max_steps = max_steps
    if shared_base is not None:
        return _train_shared(ctx, shared_base, policy, sync)
    names = ctx.flow.policy_names()
    if not sync and policy is None:
        if len(names) > 1:
            fail(f"this flow trains {len(names)} policies ({', '.join(names)}): name one with "
                 f"--policy")
        policy = names[0]
    if policy is not None and policy not in names:
        fail(f"no policy {policy!r} in this flow (policies: {', '.join(names)})")
    from astraflow.local.supervise import stop_flag

    stop = stop_flag()
    if sync:
        from astraflow.local.sync import run_sync

        run_sync(ctx, should_stop=stop)
    else:
        from astraflow.train.dist import Ranks
        from astraflow.train.trainer import Trainer

        # Alone, or one of N ranks under torchrun (WORLD_SIZE/RANK in the environment).
        ranks = Ranks.from_env(ctx.flow.trainer.device)
        if ranks.main and ctx.weights().latest(policy) is None:
            # Started on its own (a cloud trainer): make version 0 first, as `run` would.
            from rich.console import Console

            from astraflow.train.version0 import publish_version0

            publish_version0(ctx, Console(stderr=True), [policy])
        ranks.barrier()
        try:
            Trainer(ctx, policy, ranks=ranks).run(should_stop=stop)
        finally:
            ranks.close()


def _train_shared(ctx, group: str, policy: str | None, sync: bool) -> None:
    """`train --shared-base GROUP`: the policies of that base, in one process."""
    bases = ctx.flow.shared_bases()
    if policy is not None or sync:
        fail("--shared-base trains a base's policies in async mode: give neither --policy "
             "nor --mode sync with it")
    if group not in bases:
        fail(f"no policy of this flow has model.shared_base: {group} (shared bases: "
             f"{', '.join(bases) or 'none'})")
    from rich.console import Console

    from astraflow.local.supervise import stop_flag
    from astraflow.train.adapters import run_together, trainers_for
    from astraflow.train.version0 import publish_version0

    stop = stop_flag()
    missing = [p for p in bases[group] if ctx.weights().latest(p) is None]
    if missing:  # started on its own: make version 0 first, as `run` would
        publish_version0(ctx, Console(stderr=True), missing)
    run_together(trainers_for(ctx, bases[group]), max_steps=ctx.flow.stop.max_steps,
                 should_stop=stop)


@app.command(name="eval")
def eval_(
    run_dir: RunTarget,
    version: Annotated[int | None, typer.Option(help="weight version (default: newest)")] = None,
    policy: Annotated[str | None, typer.Option(help="policy to evaluate (default: every one)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print {flow, policies: {policy: "
                                                         "{version, metric, accuracy, tasks}}}")
                       ] = False,
) -> None:
    """Greedy held-out metric of a published weight version (accuracy for a solver,
    judgement accuracy for a verifier), one line per policy."""
    ctx = open_run(run_dir, "eval", quiet=as_json)
    from astraflow.local.evaluate import EvalError, held_out

    out: dict[str, dict[str, object]] = {}
    try:
        for name, r in held_out(ctx, policy, version):
            out[name] = r
            if not as_json:
                typer.echo(f"{name} v{r['version']}: held-out {r['metric']} {r['accuracy']:.1%} "
                           f"on {r['tasks']} tasks")
    except EvalError as err:
        fail(str(err))
    if as_json:
        typer.echo(json.dumps({"flow": ctx.flow.name, "policies": out}, indent=2))
