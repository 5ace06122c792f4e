"""`astraflow status`: a run's progress per policy, as a table for people or JSON for scripts.

The table is derived from one RunView refresh (each table read once); the JSON
keeps the ledger totals `status` always printed (see `status_json`).
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from astraflow.observe.view import RunView

#: Trainer steps the rates and wait fraction are taken over.
WINDOW_STEPS = 20


def _trend(value: float | None, delta: float | None, fmt: str = "{:.3f}") -> Text:
    if value is None:
        return Text("—", style="dim")
    out = Text(fmt.format(value))
    if delta is not None and abs(delta) > 1e-9:
        up = delta > 0
        out.append(f" {'↑' if up else '↓'}{abs(delta):.3f}", style="green" if up else "red")
    return out


def policy_summary(view: RunView, policy: str) -> dict[str, Any]:
    """The numbers of one policy's status row (also the dashboard's header)."""
    get = view.get
    steps = get("trainer", policy, "step_time_s")
    waits = get("trainer", policy, "trainer_wait_s").values[-WINDOW_STEPS:]
    busy = steps.values[-WINDOW_STEPS:]
    rows = get("trainer", policy, "rows_read").values[-WINDOW_STEPS:]
    span = sum(waits) + sum(busy)
    prog = view.progress.get(policy)
    reward, heldout = get("trainer", policy, "reward_mean"), get("eval", policy, "heldout_accuracy")
    versions = view.versions.get(policy) or []
    return {
        "step": prog.step if prog else (steps.steps[-1] if steps.steps else None),
        "version": versions[-1] if versions else None,
        "reward": reward.last(), "reward_trend": reward.trend(),
        "heldout": heldout.last(), "heldout_trend": heldout.trend(2),
        "heldout_version": heldout.steps[-1] if heldout.steps else None,
        "rows_per_s": sum(rows) / span if span > 0 else None,
        "staleness": get("trainer", policy, "staleness_mean").last(),
        "trainer_wait": sum(waits) / span if span > 0 else None,
        # Rows the workers did not start for this policy (closed: its trainer behind) and
        # rows they generated only as another role's input (its trainer done).
        "rows_not_started": sum(get("rollout", policy, "rows_not_started").values),
        "rows_fed": sum(get("rollout", policy, "rows_fed").values),
        "trajectory_rows": len(view.rows[policy].times),
    }


def _rows(committed: int, staged: int) -> Text:
    """The table's rows, and those written but staged until the trainer's next read."""
    out = Text(str(committed))
    if staged:
        out.append(f" +{staged} staged", style="dim")
    return out


def render(view: RunView) -> Group:
    """One table of policies, then components and pools."""
    flow = view.ctx.flow
    pols = Table(title=f"{flow.name} ({flow.mode}) · {view.ctx.store_uri}", title_justify="left")
    for col in ("policy", "step", "version", "reward", "held-out", "rows/s", "staleness",
                "trainer wait", "rows", "not started", "fed"):
        pols.add_column(col, justify="left" if col == "policy" else "right")
    for p in view.policies:
        s = policy_summary(view, p)
        held = _trend(s["heldout"], s["heldout_trend"], "{:.1%}")
        if s["heldout_version"] is not None:
            held.append(f" (v{s['heldout_version']})", style="dim")
        pols.add_row(
            p, "—" if s["step"] is None else str(s["step"]),
            "—" if s["version"] is None else f"v{s['version']}",
            _trend(s["reward"], s["reward_trend"]), held,
            "—" if s["rows_per_s"] is None else f"{s['rows_per_s']:.1f}",
            "—" if s["staleness"] is None else f"{s['staleness']:.2f}",
            "—" if s["trainer_wait"] is None else f"{s['trainer_wait']:.0%}",
            _rows(s["trajectory_rows"], view.staged(p)), str(int(s["rows_not_started"])),
            str(int(s["rows_fed"])))
    parts: list[Any] = [pols]
    comps = Table(title="components", title_justify="left")
    for col in ("component", "state", "pid", "restarts", "last exits"):
        comps.add_column(col)
    if view.components is None:
        comps.add_row("—", "no components.json here (a cloud run: see `sky jobs queue`)",
                      "", "", "")
    else:
        for name, c in view.components.items():
            state = "running" if c.get("pid") else (
                "finished" if (c.get("exit_codes") or [None])[-1] == 0 else "stopped")
            comps.add_row(name, state, str(c.get("pid") or ""), str(c.get("restarts", 0)),
                          " ".join(map(str, c.get("exit_codes") or [])))
    parts.append(comps)
    pools = Table(title="rollout pools (workers with rows in the run's last 60 s)",
                  title_justify="left")
    for col in ("pool", "workers", "ids"):
        pools.add_column(col)
    live = view.live_workers()
    for pool, ws in sorted(live.items()):
        pools.add_row(pool, str(len(ws)), ", ".join(sorted(ws)))
    if not live:
        pools.add_row("—", "0", "no rows yet")
    parts.append(pools)
    return Group(*parts)


def status_json(view: RunView) -> dict[str, Any]:
    """Ledger totals per policy under `policies`, plus the newest weight versions and
    row counts. With one policy its totals are also at the top level, as `status` printed
    them before there were several (scripts read `["steps"]`)."""
    ctx = view.ctx
    view.reads["ledger"] += 1
    entries = ctx.ledger().entries()  # every policy's effective ledger: one read
    out: dict[str, Any] = {"flow": ctx.flow.name, "policies": {}}
    for p in view.policies:
        mine = [e for e in entries if e.policy == p]
        totals: dict[str, Any] = {
            "steps": len(mine), "optimizer_steps": sum(e.optimizer_step for e in mine),
            "rows_read": sum(e.rows_read for e in mine),
            "rows_used": sum(e.rows_used for e in mine),
            "rows_stale": sum(e.rows_stale for e in mine),
            "rows_filtered": sum(e.rows_filtered for e in mine),
            "final_cursor": mine[-1].cursor_end if mine else 0}
        totals["weight_versions"] = (view.versions.get(p) or [])[-5:]
        totals["trajectory_rows"] = len(view.rows[p].times)
        totals["summary"] = policy_summary(view, p)
        out["policies"][p] = totals
    if len(view.policies) == 1:
        out.update(out["policies"][view.policies[0]])
    return out
