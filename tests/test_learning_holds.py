"""Learning that holds once learnt, on a real model, in the CI suite.

SmolLM2-135M-Instruct runs `examples/smollm2-math.yaml` as it ships, through the CLI,
in sync mode (lock-step: the same rows and updates on every run of this machine, so
the test depends on no timing; its minutes are unbounded, so the rate's decay over the
run's budget is over its `STEPS` steps alone), for `STEPS` trainer steps, every version kept, then
scores every version greedily on `QUESTIONS` held-out questions. Without a bound on
each update this run learnt and then collapsed (60 questions: 86.7% at v6-8, 50.0% at
v12-13; 150 questions, 16 steps: 89.3% → 48.7%; docs/benchmarks/peers.md), so the
default recipe of `hf` policies (`algorithm.max_update_kl`, the rate's decay over the
run's budget, the entropy floor) must learn and keep it.
The bound checked here is a collapse (`FALL`), not issue 34's 10-point stability aim,
which `benchmarks/peers/compare.py` measures over seeds and 10-minute runs. On the
current code neither recipe collapses in these 14 steps (with and without the bound
both fell 12.5 points on 40 questions, one draw each): this test guards against a
collapse, not against the recipe's smaller falls.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from astraflow.context import RunContext
from astraflow.local.evaluate import Evaluator
from tests.hf_fixtures import smollm2_dir  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
STEPS = 14
QUESTIONS = 40  # the held-out set's first 40: a version scores in ~6 s on 2 threads
GAIN = 0.30   # learnt: held-out at least this far over version 0
FALL = 0.25   # held: once learnt, never this far below the running best (a collapse)


def held_after_learning(curve: list[float]) -> tuple[int | None, float]:
    """(first version at v0 + GAIN, the largest fall below the running best from it)."""
    first = next((v for v, acc in enumerate(curve) if acc >= curve[0] + GAIN), None)
    if first is None:
        return None, 0.0
    best, fall = curve[first], 0.0
    for acc in curve[first:]:
        best = max(best, acc)
        fall = max(fall, best - acc)
    return first, fall


def test_held_after_learning_reads_a_collapse():
    # the collapse this test exists for (the 16-step sync draw without the bound)
    collapsed = [0.207, 0.44, 0.56, 0.76, 0.84, 0.873, 0.893, 0.78, 0.74, 0.8, 0.867,
                 0.813, 0.56, 0.487]
    assert held_after_learning(collapsed) == (2, pytest.approx(0.893 - 0.487))
    assert held_after_learning([0.2, 0.3, 0.4]) == (None, 0.0)
    assert held_after_learning([0.2, 0.6, 0.7, 0.65])[1] == pytest.approx(0.05)


@pytest.mark.slow
def test_smollm2_math_learns_and_holds_what_it_learnt(tmp_path, smollm2_dir):  # noqa: F811
    runs = tmp_path / "runs"
    sets = {"name": "holds", "policies.0.model.path": str(smollm2_dir),
            "stop.max_steps": STEPS, "stop.max_minutes": 10**6, "stop.target_accuracy": "null",
            "stop.eval_every_s": 10**9, "store.keep_last": 1000,
            "env.eval_size": QUESTIONS}
    cmd = [sys.executable, "-m", "astraflow", "run", str(ROOT / "examples/smollm2-math.yaml"),
           "--runs", str(runs), "--mode", "sync"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=tmp_path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]

    ctx = RunContext.open(runs / "holds")
    algo = ctx.flow.policies[0].algorithm  # the default recipe, not set here
    assert algo.max_update_kl and algo.entropy_floor_of_v0 and algo.lr_schedule == "cosine"
    versions = ctx.weights().versions("solver")
    # a step whose every group had one reward (all dropped as zero-variance) publishes none
    assert versions[0] == 0 and len(versions) >= STEPS - 3, versions
    ev = Evaluator(ctx, "solver")
    assert len(ev.items) == QUESTIONS
    curve = [ev(v) for v in versions]
    shown = " ".join(f"v{v}:{acc:.0%}" for v, acc in zip(versions, curve, strict=True))
    print(f"held-out on {len(ev.items)} questions: {shown}")
    first, fall = held_after_learning(curve)
    assert first is not None, f"never {GAIN:.0%} over v0: {shown}"
    assert fall < FALL, f"fell {fall:.0%} below its best after learning at v{first}: {shown}"
    assert curve[-1] >= curve[0] + GAIN, shown
