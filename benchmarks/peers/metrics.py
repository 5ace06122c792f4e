"""The pure parts of the peers benchmark: settings side by side, and what a held-out
curve says (time to + N points, best, final, worst after first reaching it, the largest
fall below the running best), with medians and spreads over seeds.

A curve is a list of (seconds on the training clock, version or step, accuracy),
version 0 first at 0 s. No torch, no TRL: tests import this module alone.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

Curve = Sequence[tuple[float, int, float]]


def side_by_side(ours: dict[str, object], theirs: dict[str, object]
                 ) -> list[tuple[str, str, str, str]]:
    """(setting, AstraFlow, TRL, "same" / "DIFFERENT" / "") for every setting either
    names, in `ours`' order then the rest; a setting only one side has is marked ""."""
    rows = []
    for key in [*ours, *(k for k in theirs if k not in ours)]:
        a, b = ours.get(key), theirs.get(key)
        mark = "" if key not in ours or key not in theirs else (
            "same" if a == b else "DIFFERENT")
        rows.append((key, "—" if key not in ours else str(a),
                     "—" if key not in theirs else str(b), mark))
    return rows


def curve_metrics(curve: Curve, *, points: float, train_s: float, steps: int,
                  samples: int) -> dict[str, float | int | None]:
    """What one run's curve says. `points` above version 0 is the target (reached when
    accuracy ≥ target, compared in whole per-mille so 0.627 + 0.40 ≥ 1.027 is not lost
    to rounding); `train_s`, `steps`, `samples` give the rates. After the first point at
    the target: the worst point and the largest fall below the running best."""
    if not curve or curve[0][1] != 0:
        raise ValueError("a curve starts with version 0")
    acc0 = curve[0][2]
    target = acc0 + points / 100
    first = next((i for i, (_, _, a) in enumerate(curve) if round(a * 1000) >= round(target * 1000)),
                 None)
    best_i = max(range(len(curve)), key=lambda i: (curve[i][2], -i))
    out: dict[str, float | int | None] = {
        "accuracy_v0": acc0, "target": target,
        "time_to_target_s": None if first is None else curve[first][0],
        "version_at_target": None if first is None else curve[first][1],
        "best": curve[best_i][2], "best_version": curve[best_i][1],
        "final": curve[-1][2], "final_version": curve[-1][1],
        "worst_after_target": None, "worst_after_target_version": None,
        "max_fall_below_best": None,
        "steps": steps, "train_s": train_s,
        "steps_per_s": steps / train_s if train_s > 0 else None,
        "samples_per_s": samples / train_s if train_s > 0 else None,
    }
    if first is not None:
        after = curve[first:]
        worst = min(after, key=lambda p: p[2])
        out["worst_after_target"], out["worst_after_target_version"] = worst[2], worst[1]
        running, fall = after[0][2], 0.0
        for _, _, acc in after:
            running = max(running, acc)
            fall = max(fall, running - acc)
        out["max_fall_below_best"] = fall
    return out


def median_spread(values: Sequence[float | None]) -> tuple[float | None, float | None,
                                                           float | None, int]:
    """(median, min, max, how many did not reach) over seeds; None values (a target
    never reached) count as missing, and the median of the rest is reported."""
    got = [v for v in values if v is not None]
    missing = len(values) - len(got)
    if not got:
        return None, None, None, missing
    return statistics.median(got), min(got), max(got), missing


SUMMARY_KEYS = ("time_to_target_s", "steps_per_s", "samples_per_s", "best", "final",
                "worst_after_target", "max_fall_below_best")


def summarize(runs: Sequence[dict]) -> dict[str, tuple[float | None, float | None,
                                                        float | None, int]]:
    """`median_spread` of every SUMMARY_KEYS figure over the runs of one tool."""
    return {k: median_spread([r.get(k) for r in runs]) for k in SUMMARY_KEYS}


def fmt(key: str, v: float | None) -> str:
    if v is None:
        return "—"
    if key in ("best", "final", "worst_after_target", "accuracy_v0", "target"):
        return f"{v:.1%}"
    if key == "max_fall_below_best":
        return f"{100 * v:.1f} pts"
    if key.endswith("_per_s"):
        return f"{v:.3g}/s"
    if key.endswith("_s"):
        return f"{v:.0f} s"
    return f"{v:.3g}"


def fmt_summary(key: str, stat: tuple[float | None, float | None, float | None, int]) -> str:
    """`median (min–max)`, and how many seeds never reached the target."""
    med, lo, hi, missing = stat
    text = fmt(key, med) if lo == hi else f"{fmt(key, med)} ({fmt(key, lo)}–{fmt(key, hi)})"
    return text + (f", {missing} not reached" if missing else "")
