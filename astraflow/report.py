"""Run summary and plots, read back from the store (one source for every view)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from astraflow.run import RunContext


def metric_series(ctx: RunContext, name: str, component: str | None = None) -> list[tuple[float, float]]:
    t = ctx.ledger().read_metrics(names=[name]).to_pylist()
    rows = [r for r in t if component is None or r["component"] == component]
    return sorted((r["time"], r["value"]) for r in rows)


def ledger_totals(ctx: RunContext) -> dict[str, int]:
    entries = ctx.ledger().entries(ctx.flow.policy.name)
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


def plot(ctx: RunContext, t0: float, acc0: float | None = None,
         final: tuple[float, float] | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reward = metric_series(ctx, "reward_mean", "trainer")
    acc = metric_series(ctx, "heldout_accuracy", "eval")
    fig, ax = plt.subplots(figsize=(7, 4))
    if reward:
        ax.plot([t - t0 for t, _ in reward], [v for _, v in reward], lw=0.8, alpha=0.6,
                label="train reward (sampled, T=1)")
    if acc:
        ax.plot([t - t0 for t, _ in acc], [v for _, v in acc], "o-", label="held-out accuracy (greedy)")
    if acc0 is not None:
        ax.axhline(acc0, ls="--", color="grey", lw=1, label=f"version 0 held-out ({acc0:.0%})")
    if final is not None:
        ax.plot([final[0]], [final[1]], "r*", ms=12, label=f"final held-out ({final[1]:.0%}, all tasks)")
    ax.set_xlabel("seconds since components started")
    ax.set_ylabel("reward / accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(f"{ctx.flow.name} ({ctx.flow.mode})")
    path = ctx.run_dir / "progress.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
