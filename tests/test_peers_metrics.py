"""benchmarks/peers/: the pure parts of the TRL comparison (no TRL, no training here).

The settings table marks what differs; the curve metrics give the time to v0 + N points,
the worst held-out after first reaching it and the largest fall below the running best;
medians and spreads over seeds leave out a seed that never reached the target.
"""

from __future__ import annotations

import pytest

from benchmarks.peers.metrics import (
    curve_metrics,
    fmt_summary,
    median_spread,
    side_by_side,
    summarize,
)

# A run like the draw 1: v0 22.7%, +40 first at v4 (97 s), a collapse to 15.3%
# at v19, back to 82.7% at the end.
CURVE = [(0.0, 0, 0.227), (40.0, 1, 0.30), (60.0, 2, 0.45), (80.0, 3, 0.60),
         (97.0, 4, 0.627), (110.0, 8, 0.893), (200.0, 19, 0.153), (300.0, 24, 0.827)]


def test_side_by_side_marks_what_differs_and_what_one_side_lacks():
    rows = side_by_side({"lr": 2e-5, "betas": (0.9, 0.99), "threads": 3},
                        {"lr": 2e-5, "betas": (0.9, 0.999), "loss": "dapo"})
    assert rows == [("lr", "2e-05", "2e-05", "same"),
                    ("betas", "(0.9, 0.99)", "(0.9, 0.999)", "DIFFERENT"),
                    ("threads", "3", "—", ""), ("loss", "—", "dapo", "")]


def test_curve_metrics_time_to_target_best_final_and_worst_after_target():
    m = curve_metrics(CURVE, points=40, train_s=300.0, steps=24, samples=24 * 32)
    assert m["accuracy_v0"] == 0.227 and m["target"] == pytest.approx(0.627)
    # 0.627 is exactly the target: reached (whole per-mille, not lost to float rounding)
    assert m["time_to_target_s"] == 97.0 and m["version_at_target"] == 4
    assert (m["best"], m["best_version"]) == (0.893, 8)
    assert (m["final"], m["final_version"]) == (0.827, 24)
    assert (m["worst_after_target"], m["worst_after_target_version"]) == (0.153, 19)
    assert m["max_fall_below_best"] == pytest.approx(0.893 - 0.153)
    assert m["steps_per_s"] == pytest.approx(24 / 300) and m["samples_per_s"] == pytest.approx(2.56)


def test_a_curve_before_the_target_says_nothing_of_after_it():
    m = curve_metrics(CURVE[:3], points=40, train_s=60.0, steps=2, samples=64)
    assert m["time_to_target_s"] is None and m["worst_after_target"] is None
    assert m["max_fall_below_best"] is None and m["best"] == 0.45
    # a dip before the target does not count against stability
    m = curve_metrics([(0, 0, 0.2), (10, 1, 0.05), (20, 2, 0.7), (30, 3, 0.65)], points=40,
                      train_s=30, steps=3, samples=96)
    assert m["worst_after_target"] == 0.65 and m["max_fall_below_best"] == pytest.approx(0.05)
    with pytest.raises(ValueError, match="version 0"):
        curve_metrics(CURVE[1:], points=40, train_s=1, steps=1, samples=1)


def test_medians_and_spreads_over_seeds_leave_out_a_target_never_reached():
    assert median_spread([97.0, 120.0, 81.0]) == (97.0, 81.0, 120.0, 0)
    assert median_spread([97.0, None, 81.0]) == (89.0, 81.0, 97.0, 1)
    assert median_spread([None]) == (None, None, None, 1)
    runs = [curve_metrics(CURVE, points=40, train_s=300.0, steps=24, samples=768),
            curve_metrics(CURVE[:3], points=40, train_s=60.0, steps=2, samples=64)]
    s = summarize(runs)
    assert s["time_to_target_s"] == (97.0, 97.0, 97.0, 1)
    assert s["final"] == (pytest.approx((0.827 + 0.45) / 2), 0.45, 0.827, 0)
    assert fmt_summary("final", (0.64, 0.45, 0.827, 0)) == "64.0% (45.0%–82.7%)"
    assert fmt_summary("steps_per_s", (0.1, 0.1, 0.1, 0)) == "0.1/s"   # one seed: no range
    assert fmt_summary("time_to_target_s", s["time_to_target_s"]) == "97 s, 1 not reached"
