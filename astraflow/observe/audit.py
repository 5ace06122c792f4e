"""`astraflow audit RUN`: prove exactly-once from what the store holds, nothing else.

Reads the ledger, the trajectory tables, the weight store and the checkpoints
and checks, per policy:

  * the effective ledger (rollbacks applied) has steps 0..n-1, each once, whose
    cursor ranges tile (0, final cursor] with no gap and no overlap;
  * every step's rows add up (used + stale + filtered = read), and the table
    really holds that many rows in the step's range;
  * no trajectory id appears twice in the table (a batch committed twice);
  * weight versions are monotonic (time and parent) and every manifest verifies;
    ledger weight versions never go backwards; rows name only published versions;
  * every checkpoint verifies, and the newest agrees with the ledger.

Violations are listed and make the command exit non-zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from astraflow.context import RunContext
from astraflow.stores import CheckpointError, WeightError, check_ledger, replay
from astraflow.stores.schema import CREATED_AT_VERSION


@dataclass
class PolicyAudit:
    policy: str
    counts: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def audit_policy(ctx: RunContext, policy: str) -> PolicyAudit:
    out = PolicyAudit(policy)
    bad = out.violations.append
    rep = replay(ctx.ledger().history(policy))
    out.violations += rep.problems
    eff = rep.effective
    out.violations += check_ledger(eff)
    final_cursor = eff[-1].cursor_end if eff else 0

    traj = ctx.trajectories()
    rows = traj.read_range(policy, 0, 2**62, columns=["traj_id", "behavior_version"])
    versions = np.sort(rows.column(CREATED_AT_VERSION).to_numpy())
    ids = rows.column("traj_id").to_numpy(zero_copy_only=False)
    uniq, counts = np.unique(ids, return_counts=True)
    dup = counts > 1
    if dup.any():
        bad(f"{int((counts[dup] - 1).sum())} rows appear more than once in the table "
            f"(e.g. traj_id {uniq[dup][0]!r}): a batch was committed twice")
    table_version = traj.latest_version(policy)
    if final_cursor > table_version:
        bad(f"final cursor {final_cursor} is beyond the table's newest version {table_version}")
    for e in eff:
        held = int(np.searchsorted(versions, e.cursor_end, "right")
                   - np.searchsorted(versions, e.cursor_start, "right"))
        if held != e.rows_read:
            what = "rows lost after the ledger counted them" if held < e.rows_read else (
                "rows silently skipped")
            bad(f"step {e.step}: the ledger read {e.rows_read} rows in ({e.cursor_start}, "
                f"{e.cursor_end}] but the table holds {held} there ({what})")
    for a, b in zip(eff, eff[1:], strict=False):
        if b.weight_version < a.weight_version:
            bad(f"step {b.step}: weight version went back from v{a.weight_version} "
                f"to v{b.weight_version}")

    ws = ctx.weights()
    vs = ws.versions(policy)
    verified = 0
    prev_time = -1.0
    for v in vs:
        try:
            man = ws.manifest(policy, v)
            ws.load(policy, v, refresh=True)  # the objects in the store, not a cache
        except WeightError as err:
            bad(f"weights v{v}: {err}")
            continue
        verified += 1
        if man.version != v or man.policy != policy:
            bad(f"weights v{v}: manifest names {man.policy} v{man.version}")
        if man.parent is not None and man.parent >= v:
            bad(f"weights v{v}: parent v{man.parent} is not older")
        if man.time <= prev_time:
            bad(f"weights v{v}: published before the version below it")
        prev_time = man.time
    behaviour = rows.column("behavior_version").to_numpy()
    if vs and behaviour.size and int(behaviour.max()) > vs[-1]:
        bad(f"rows name weight version v{int(behaviour.max())}, newer than any published "
            f"(v{vs[-1]})")

    cs = ctx.checkpoints()
    ckpts = cs.steps(policy)
    ck_ok = 0
    for step in ckpts:
        try:
            ck = cs.load(policy, step)
        except CheckpointError as err:
            bad(str(err))
            continue
        ck_ok += 1
        if step == ckpts[-1]:
            done, cursor = ck.meta["steps_done"], ck.meta["cursor"]
            if done > len(eff):
                bad(f"newest checkpoint is after step {done - 1} but the ledger has {len(eff)} steps")
            elif done and eff[done - 1].cursor_end != cursor:
                bad(f"newest checkpoint's cursor {cursor} differs from the ledger's "
                    f"{eff[done - 1].cursor_end} after step {done - 1}")

    consumed = int(np.searchsorted(versions, final_cursor, "right"))
    out.counts = {
        "steps": len(eff),
        "rollbacks": rep.rollbacks,
        "voided_steps": len(rep.voided),
        "rows_in_table": int(versions.size),
        "rows_up_to_final_cursor": consumed,
        "rows_trained": sum(e.rows_used for e in eff),
        "rows_dropped_stale": sum(e.rows_stale for e in eff),
        "rows_dropped_filtered": sum(e.rows_filtered for e in eff),
        "rows_retrained_after_rollback": sum(e.rows_read for e in rep.voided),
        "rows_not_yet_consumed": int(versions.size) - consumed,
        # Staged by writers that lost a commit race (stores.staging): committed, exactly
        # once, by the trainer's next read; not in the table yet, so not in the checks above.
        "rows_staged": traj.pending(policy),
        "duplicate_rows": int((counts[dup] - 1).sum()) if dup.any() else 0,
        "final_cursor": final_cursor,
        "weight_versions": len(vs),
        "weight_versions_verified": verified,
        "checkpoints_verified": ck_ok,
        "violations": len(out.violations),
    }
    accounted = (out.counts["rows_trained"] + out.counts["rows_dropped_stale"]
                 + out.counts["rows_dropped_filtered"])
    if accounted != consumed:
        bad(f"{consumed} rows up to the final cursor but {accounted} trained or dropped "
            f"with a reason")
    return out


def audit(ctx: RunContext) -> list[PolicyAudit]:
    return [audit_policy(ctx, p.name) for p in ctx.flow.policies]
