"""The launcher's progress line: step of max, ETA, and which version a held-out figure is."""

from __future__ import annotations


def test_progress_line_shows_step_of_max_eta_and_the_version_of_the_held_out_figure():
    from astraflow.local.launcher import LEGEND, progress_line

    m = {"step": 9, "weight_version": 7, "reward_mean": 0.5, "rows_read": 256,
         "step_time_s": 0.5, "trainer_wait_s": 0.5, "staleness_mean": 1.0}
    live = {"t": 90.0, "version": {"solver": 6}, "accuracy": {"solver": 0.42}}
    line = progress_line(100.0, "", m, live, "solver", max_steps=40, time_left_s=3600)
    assert "step 10/40" in line and "v7" in line
    assert "42.0% of v6 (10s ago)" in line
    assert "ETA 5.0 min" in line          # 30 steps left at 10 s a step
    assert "256 rows/s" in line
    short = progress_line(100.0, "", m, None, "solver", max_steps=40, time_left_s=60)
    assert "ETA 1.0 min" in short and "held-out —" in short   # the wall clock ends it first
    assert "{total}" in LEGEND and "ETA" in LEGEND
