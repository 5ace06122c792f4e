"""Run summary and plots, read back from the store (one source for every view)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from astraflow.context import RunContext


def ledger_totals(ctx: RunContext, policy: str | None = None) -> dict[str, int]:
    entries = ctx.ledger().entries(policy or ctx.flow.policy.name)
    return {
        "steps": len(entries),
        "optimizer_steps": sum(e.optimizer_step for e in entries),
        "rows_read": sum(e.rows_read for e in entries),
        "rows_used": sum(e.rows_used for e in entries),
        "rows_stale": sum(e.rows_stale for e in entries),
        "rows_filtered": sum(e.rows_filtered for e in entries),
        "final_cursor": entries[-1].cursor_end if entries else 0,
    }


def write_summary(ctx: RunContext, summary: dict[str, Any]) -> Path:
    path = ctx.run_dir / "summary.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True))
    tmp.replace(path)
    return path


def plot(ctx: RunContext, t0: float, acc0: dict[str, float] | None = None,
         final: dict[str, tuple[float, float]] | None = None) -> Path:
    """Train reward and held-out metric over time, one colour per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    policies = ctx.flow.policy_names()
    # Live points score the first `live_eval_size` held-out tasks (cheap enough to run
    # beside the components); v0 and the final star score all `eval_size`: the labels
    # say so, since the two can differ by a few points.
    total = ctx.flow.env.eval_size
    live_n = min(ctx.flow.stop.live_eval_size, total)
    temp = ctx.flow.rollout.temperature
    evals = ctx.ledger().read_metrics(names=["heldout_accuracy"]).to_pylist()
    rewards = ctx.ledger().read_metrics(names=["reward_mean"]).to_pylist()
    for i, p in enumerate(policies):
        colour = f"C{i}"
        tag = f"{p}: " if len(policies) > 1 else ""
        reward = sorted((r["time"], r["value"]) for r in rewards
                        if r["component"] == "trainer" and r["policy"] == p)
        acc = sorted((r["time"], r["value"]) for r in evals
                     if r["component"] == "eval" and r["policy"] == p)
        if reward:
            ax.plot([t - t0 for t, _ in reward], [v for _, v in reward], lw=0.8, alpha=0.4,
                    color=colour, label=f"{tag}train reward (sampled, T={temp:g})")
        if acc:
            ax.plot([t - t0 for t, _ in acc], [v for _, v in acc], "o-", ms=3, color=colour,
                    label=f"{tag}held-out, live (greedy, {live_n} of {total} tasks)")
        if acc0 and p in acc0:
            ax.axhline(acc0[p], ls="--", color=colour, lw=1, label=f"{tag}v0 held-out ({acc0[p]:.0%}, {total} tasks)")
        if final and p in final:
            t, a = final[p]
            ax.plot([t], [a], "*", color=colour, ms=12, label=f"{tag}final held-out ({a:.0%}, {total} tasks)")
    ax.set_xlabel("seconds since components started")
    ax.set_ylabel("reward / accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    ax.set_title(f"{ctx.flow.name} ({ctx.flow.mode})")
    path = ctx.run_dir / "progress.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
