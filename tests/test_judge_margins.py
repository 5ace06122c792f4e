"""benchmarks/judge_margins.py: the margin at a judge's verdict word, and the shift table."""

from __future__ import annotations

import json

import pytest

from benchmarks import judge_margins as jm


def test_a_shift_of_the_prior_turns_near_ties_into_one_verdict():
    V = jm.Verdict
    # Two right answers and two near misses, judged right by 0.05-nat margins, and one
    # sure accept of a right answer; one reply with no verdict word (judged wrong).
    verdicts = [V(True, "correct", 0.05, True), V(True, "correct", 0.04, True),
                V(False, "incorrect", -0.05, True), V(False, "incorrect", -0.03, True),
                V(True, "correct", 2.0, True), V(False, "maybe", None, False)]
    s = jm.summarise(verdicts, shifts=(-0.1, 0.0, 0.1))
    assert s["accuracy"] == pytest.approx(5 / 6)
    assert s["right"] == {"items": 3, "accept_share": 1.0,
                          "mean_margin": pytest.approx((0.05 + 0.04 + 2.0) / 3)}
    assert s["near_miss"]["accept_share"] == 0.0 and s["near_miss"]["items"] == 3
    assert s["no_verdict"] == 1 and s["ties"] == 4
    # +0.1: both near misses are now accepted; the right answers stay accepted
    assert s["accuracy_if_shifted"]["+0.10"] == pytest.approx(3 / 6)
    # -0.1: the two near-tie right answers are rejected; the sure one holds
    assert s["accuracy_if_shifted"]["-0.10"] == pytest.approx(3 / 6)
    assert s["accuracy_if_shifted"]["+0.00"] == pytest.approx(5 / 6)


@pytest.mark.slow
def test_the_margin_is_read_where_smollm2_writes_its_verdict(smollm2_dir, tmp_path):
    """On SmolLM2 version 0 and the solver-verifier example's held-out items: a verdict
    is an accept exactly when its margin is positive (read at the wrong step, the sign
    would not follow the greedy word), and the summary counts every item."""
    out = tmp_path / "m.json"
    assert jm.main(["--model", str(smollm2_dir), "--n", "6", "--threads", "1",
                    "--out", str(out)]) == 0
    from astraflow.workflows.judge import ACCEPT, verdict

    got = json.loads(out.read_text())
    assert got["summary"]["items"] == 6
    assert [v["right"] for v in got["verdicts"]] == [True, False] * 3  # balanced items
    for v in got["verdicts"]:
        assert v["margin"] is not None, v["reply"]
        assert (v["margin"] > 0) == (verdict(v["reply"]) == ACCEPT), v
