"""`astraflow inspect`: read a run's episodes as text, decoded with the policy's own codec.

A row is one policy's part of one episode (stores/schema.py). Its completion
holds every turn: tokens the policy generated (loss mask 1) and text it only
read — tool results, another role's words (mask 0) — so turns are the runs of
equal mask. The advantage is not stored (the trainer computes it while
staging); it is recomputed here from the row's whole group with the flow's own
`group_advantages` stage, as the trainer did.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from rich.console import Group
from rich.panel import Panel
from rich.text import Text

from astraflow.context import RunContext
from astraflow.stores.read import sql_str
from astraflow.stores.schema import CREATED_AT_VERSION
from astraflow.stores.trajectories import table_name


class InspectError(ValueError):
    """A bad filter or a policy/version that is not there: one line for the user."""


@dataclass
class Episode:
    row: dict[str, Any]
    prompt: str
    turns: list[tuple[str, str]]
    """(who, text): `policy` for generated tokens, `context` for text it only read."""
    advantage: float | None
    extras: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        r = self.row
        return {"traj_id": r["traj_id"], "group_id": r["group_id"], "policy": r["policy"],
                "behavior_version": r["behavior_version"], "reward": r["reward"],
                "advantage": self.advantage, "task_id": r["task_id"], "worker": r["worker"],
                "created_at": str(r["created_at"]), "prompt": self.prompt,
                "turns": [{"who": w, "text": t} for w, t in self.turns], "extras": self.extras}


def query(ctx: RunContext, policy: str, *, version: int | None = None, where: str | None = None,
          limit: int = 5) -> pa.Table:
    """The newest `limit` rows of `policy` matching the filters (newest first)."""
    if policy not in ctx.flow.policy_names():
        raise InspectError(f"no policy {policy!r} in this flow "
                           f"(policies: {', '.join(ctx.flow.policy_names())})")
    clauses = [f"({where})"] if where else []
    if version is not None:
        clauses.append(f"behavior_version = {int(version)}")
    flt = " AND ".join(clauses) or None
    traj = ctx.trajectories()
    try:  # live and retired rows (`TrajectoryStore.scan`)
        keys = traj.scan(policy, ["created_at", "traj_id"], flt, retry_reads=False)
    except Exception as err:  # lance's parser/planner errors: ValueError, OSError, ...
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        msg = re.sub(r",\s*/\S+\.rs:\d+:\d+", "", msg)  # lance's Rust source location
        raise InspectError(f"bad --where filter {where!r} on {table_name(policy)}: {msg}") from None
    if keys.num_rows == 0:
        return keys
    keys = keys.sort_by([(CREATED_AT_VERSION, "descending"),
                         ("created_at", "descending")]).slice(0, limit)
    ids = ", ".join(f"'{sql_str(t)}'" for t in keys.column("traj_id").to_pylist())
    rows = traj.scan(policy, where=f"traj_id IN ({ids})").drop_columns([CREATED_AT_VERSION])
    order = {t: i for i, t in enumerate(keys.column("traj_id").to_pylist())}
    return rows.take(sorted(range(rows.num_rows),
                            key=lambda i: order[rows.column("traj_id")[i].as_py()]))


def advantages(ctx: RunContext, policy: str, rows: pa.Table) -> dict[str, float]:
    """Each row's advantage as the trainer's `group_advantages` stage computes it from the
    row's whole group; empty when the policy's stages compute none."""
    spec = next((s for s in ctx.flow.stages_for(policy) if s.name == "group_advantages"), None)
    if spec is None or rows.num_rows == 0:
        return {}
    from astraflow.data.stages import group_advantages

    groups = ", ".join(f"'{sql_str(g)}'"
                       for g in set(rows.column("group_id").to_pylist()))
    members = ctx.trajectories().scan(policy, ["traj_id", "group_id", "reward"],
                                      f"group_id IN ({groups})")
    out = group_advantages(members, None, **spec.params).rows  # type: ignore[arg-type]
    return dict(zip(out.column("traj_id").to_pylist(), out.column("advantage").to_pylist(),
                    strict=True))


def segments(ids: list[int], mask: list[int]) -> Iterator[tuple[int, list[int]]]:
    """Runs of equal loss mask: (mask, ids)."""
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            if i > start:
                yield mask[start], ids[start:i]
            start = i


def decode(ctx: RunContext, policy: str, rows: pa.Table) -> list[Episode]:
    """Episodes of `rows`, decoded with the codec saved with the policy's newest version
    (every version carries the same tokenizer forward, so it decodes every row)."""
    from astraflow.models.codec import load_codec

    ws = ctx.weights()
    latest = ws.latest(policy)
    if latest is None:
        raise InspectError(f"{policy} has no published weight version to decode with")
    codec = load_codec(ws.load(policy, latest))
    adv = advantages(ctx, policy, rows)
    eps = []
    for r in rows.to_pylist():
        turns = [("policy" if m else "context", codec.decode(part))
                 for m, part in segments(r["completion_ids"], r["loss_mask"])]
        try:
            extras = json.loads(r["extras"]) if r["extras"] else {}
        except json.JSONDecodeError:
            extras = {"raw": r["extras"]}
        eps.append(Episode(r, codec.decode(r["prompt_ids"]), turns, adv.get(r["traj_id"]),
                           extras))
    return eps


def render(ep: Episode) -> Panel:
    r, x = ep.row, ep.extras
    head = Text()
    head.append(f"reward {r['reward']:.3f}", style="bold green" if r["reward"] > 0 else "bold red")
    head.append("  advantage " + ("—" if ep.advantage is None else f"{ep.advantage:+.3f}"))
    head.append(f"  finish {x.get('finish_reason', '—')}  v{r['behavior_version']}  "
                f"worker {r['worker']}  task {r['task_id']}", style="dim")
    body: list[Any] = [head, Text("prompt", style="bold cyan"), Text(ep.prompt)]
    for who, text in ep.turns:
        body.append(Text(who if who == "policy" else "context (read, not trained: tool results, "
                         "other roles)", style="bold magenta" if who == "policy" else "bold yellow"))
        body.append(Text(text))
    for key in ("tool_calls", "tool_results", "tools"):
        if key in x:
            body.append(Text(key, style="bold yellow"))
            body.append(Text(json.dumps(x[key], indent=1)))
    rest = {k: v for k, v in x.items() if k not in ("finish_reason", "tool_calls",
                                                      "tool_results", "tools")}
    if rest:
        body.append(Text("extras " + json.dumps(rest), style="dim"))
    return Panel(Group(*body), title=f"{r['policy']} · {r['traj_id'][:12]} · group "
                 f"{r['group_id']}", title_align="left")
