"""The launcher's progress line: step of max, ETA, which version a held-out figure is,
and rows trained per wall second."""

from __future__ import annotations


def test_progress_line_shows_step_of_max_eta_and_the_version_of_the_held_out_figure():
    from astraflow.local.launcher import LEGEND, progress_line

    m = {"step": 9, "weight_version": 7, "reward_mean": 0.5, "rows_read": 256,
         "step_time_s": 0.5, "trainer_wait_s": 0.5, "staleness_mean": 1.0}
    live = {"t": 90.0, "version": {"solver": 6}, "accuracy": {"solver": 0.42}}
    line = progress_line(100.0, "", m, live, "solver", max_steps=40, time_left_s=3600,
                         rate=3.25)
    assert "step 10/40" in line and "v7" in line
    assert "42.0% of v6 (10s ago)" in line
    assert "ETA 5.0 min" in line          # 30 steps left at 10 s a step
    assert "3.2 rows/s" in line
    short = progress_line(100.0, "", m, None, "solver", max_steps=40, time_left_s=60)
    assert "ETA 1.0 min" in short and "held-out —" in short   # the wall clock ends it first
    assert "— rows/s" in short            # no rate yet: a dash, never a made-up figure
    assert "{total}" in LEGEND and "ETA" in LEGEND and "{window}" in LEGEND


def test_rows_per_second_is_rows_trained_over_wall_time_not_one_steps_time():
    """The issue's symptom: a step that only filters 32 rows already waiting takes 20 ms
    and no wait, and 32 / 0.02 s printed 1,600 rows/s while the run trained ~3 a second."""
    from astraflow.local.launcher import progress_line, trained_rate

    # 10 s steps of 32 rows, one of which trained nothing (every group zero-advantage)
    # and took 20 ms straight after the one before
    steps = [(0.0, 32), (10.0, 32), (20.0, 32), (20.02, 0), (30.0, 32), (40.0, 32)]
    rate = trained_rate(steps)
    assert rate is not None and abs(rate - 128 / 40) < 1e-9
    m = {"step": 5, "rows_read": 32, "rows_used": 0, "step_time_s": 0.02, "trainer_wait_s": 0.0}
    line = progress_line(40.0, "", m, None, "solver", max_steps=40, time_left_s=600, rate=rate)
    assert "3.2 rows/s" in line
    assert "1600" not in line
    assert trained_rate(steps[:1]) is None and trained_rate([]) is None
    assert trained_rate([(5.0, 32), (5.0, 32)]) is None   # no wall time between them
