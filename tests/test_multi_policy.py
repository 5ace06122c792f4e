"""Several policies in one flow: episode rows, masks, per-policy trainers, the barrier."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict

import pytest

from astraflow.config.loader import FlowError, parse_flow
from astraflow.context import RunContext
from astraflow.envs.math import MathEnv
from astraflow.local.sync import run_sync
from astraflow.models.tokenizer import CharCodec
from astraflow.rollout.worker import RolloutWorker
from astraflow.train.trainer import Trainer
from astraflow.workflows.solver_verifier import agree
from tests.runs import seeded_run

TINY = {"hidden_size": 64, "layers": 2, "heads": 2, "intermediate_size": 128}


def make_ctx(tmp_path, tiny_policy_dir, **extra) -> RunContext:
    return seeded_run(tmp_path / "run", {
        "name": "mp", "policies": [{"name": "solver", "model": TINY},
                                   {"name": "verifier", "model": TINY}],
        "workflow": {"name": "solver_verifier"},
        "env": {"digits": 2, "eval_size": 20},
        "rollout": {"prompts_per_batch": 3, "samples_per_prompt": 4, "max_backlog_batches": 4},
        "stages": [{"name": "group_advantages"}],
        **extra,
    }, tiny_policy_dir, every_policy=True)


def test_episode_rows_land_in_each_policys_table_with_its_own_mask(tmp_path, tiny_policy_dir):
    ctx = make_ctx(tmp_path, tiny_policy_dir)
    w = RolloutWorker(ctx, "wA")
    assert w.refresh_weights() and w.versions == {"solver": 0, "verifier": 0}
    traj = ctx.trajectories()
    before = {p: traj.latest_version(p) for p in ("solver", "verifier")}
    assert w.produce_batch() == 3 * 4 * 2
    solver = traj.read_range("solver", 0, 10**9).to_pylist()
    verifier = traj.read_range("verifier", 0, 10**9).to_pylist()
    assert len(solver) == len(verifier) == 12
    assert {p: traj.latest_version(p) - v for p, v in before.items()} == {"solver": 1, "verifier": 1}
    assert {r["policy"] for r in solver} == {"solver"} and {r["policy"] for r in verifier} == {"verifier"}
    assert {json.loads(r["extras"])["role"] for r in verifier} == {"verifier"}

    codec, env = CharCodec.default(), MathEnv(digits=2)
    answers: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for r in solver:  # the solver's part: its answer, every token its own
        assert r["loss_mask"] == [1] * len(r["completion_ids"]) and len(r["completion_ids"]) > 0
        assert len(r["behavior_logprobs"]) == len(r["completion_ids"])
        text = codec.decode(r["completion_ids"])
        task = next(t for t in [env._task(int(r["task_id"][:2]), int(r["task_id"][3:]))])
        assert r["reward"] == env.reward(task, text)
        answers[r["task_id"]].append((text, r["reward"]))
    judged: dict[str, list[str]] = defaultdict(list)
    for r in verifier:
        comp, mask, lps = r["completion_ids"], r["loss_mask"], r["behavior_logprobs"]
        # Its own working (mask 1), then the comparison tool's transcript ";<answer>?<verdict>"
        # that it only reads (mask 0): the very sequence it saw, trained on its tokens only.
        n = mask.index(0)
        assert n >= 1 and all(mask[:n]) and not any(mask[n:]), mask
        assert all(lp == 0.0 for lp in lps[n:]) and all(lp <= 0.0 for lp in lps[:n])
        assert any(lp < 0.0 for lp in lps[:n])
        own, tool = codec.decode(comp[:n]), codec.decode(comp[n:])
        assert tool.startswith(";") and tool[-2] == "?" and tool[-1] in "YN"
        shown, said = tool[1:-2], tool[-1]
        assert said == agree(own, shown)
        assert codec.decode(r["prompt_ids"]) == r["task_id"] + "="  # the task is its prompt
        right = dict(answers[r["task_id"]])[shown]
        task = env._task(int(r["task_id"][:2]), int(r["task_id"][3:]))
        # A right verdict earns 1 only with a right working behind it.
        assert r["reward"] == float((said == "Y") == (right == 1.0) and env.reward(task, own) == 1.0)
        judged[r["task_id"]].append(shown)
    # Each verifier row judges one of the solver's answers to that very task.
    assert {t: sorted(v) for t, v in judged.items()} == \
        {t: sorted(a for a, _ in v) for t, v in answers.items()}
    # GRPO groups: per task, never mixing the two policies' parts.
    assert len({r["group_id"] for r in solver}) == len({r["group_id"] for r in verifier}) == 3

    # The verifier's trainer learns from its own tokens only.
    tr = Trainer(ctx, "verifier")
    sl = tr.poll()
    assert sl is not None and sl.num_rows == 12
    res = tr.train_on(sl)
    assert res.metrics["tokens"] == sum(sum(r["loss_mask"]) for r in verifier)
    assert tr.version == 1 and ctx.weights().latest("solver") == 0  # its own weight stream


def test_the_comparison_tool():
    assert agree("59", "59") == "Y" and agree("059", "59") == "Y" and agree("59", "58") == "N"
    assert agree("", "59") == "N" and agree("5?", "5?") == "N"


def test_one_policy_can_play_two_roles(tmp_path, tiny_policy_dir):
    flow = parse_flow({"name": "self", "policies": [{"name": "solo", "model": TINY}],
                       "workflow": {"name": "solver_verifier", "params": {"judge_samples": 2}},
                       "env": {"digits": 2},
                       "rollout": {"prompts_per_batch": 2, "samples_per_prompt": 2}})
    assert flow.role_map() == {"solver": "solo", "verifier": "solo"}
    assert flow.batch_rows("solo") == 2 * 2 + 2 * 2 * 2  # answers + two judgements of each


def test_flow_errors_name_the_fix():
    base = {"name": "x", "workflow": {"name": "solver_verifier"}}
    with pytest.raises(FlowError, match=r"needs a policy for role\(s\) \['verifier'\]"):
        parse_flow({**base, "policies": [{"name": "solver"}, {"name": "judge"}]})
    with pytest.raises(FlowError, match=r"\['b'\] play no role"):
        parse_flow({"name": "x", "policies": [{"name": "solver"}, {"name": "b"}]})
    with pytest.raises(FlowError, match="unknown workflow 'nope'"):
        parse_flow({"name": "x", "policies": [{"name": "a"}], "workflow": {"name": "nope"}})
    with pytest.raises(FlowError, match="init_from"):
        parse_flow({**base, "policies": [{"name": "solver", "warm_start": {"init_from": "verifier"}},
                                         {"name": "verifier"}]})
    ok = parse_flow({**base, "policies": [{"name": "solver"}, {"name": "judge"}],
                     "workflow": {"name": "solver_verifier", "roles": {"verifier": "judge"}}})
    assert ok.role_map() == {"solver": "solver", "verifier": "judge"}
    four = parse_flow({**base, "workflow": {"name": "solver_verifier", "params": {"verifiers": 3}},
                       "policies": [{"name": n} for n in
                                    ("solver", "verifier", "verifier_2", "verifier_3")]})
    assert four.policy_names() == ["solver", "verifier", "verifier_2", "verifier_3"]


def test_version_barrier_holds_a_trainer_until_the_others_publish(tmp_path, tiny_policy_dir):
    ctx = make_ctx(tmp_path, tiny_policy_dir, trainer={"version_barrier": True})
    w = RolloutWorker(ctx, "wA")
    w.refresh_weights()
    for _ in range(3):
        w.produce_batch()
    solver, verifier = Trainer(ctx, "solver"), Trainer(ctx, "verifier")
    solver.train_on(solver.poll())
    assert solver.version == 1  # every other policy is at v0: v1 may go out
    solver.train_on(solver.poll())
    assert solver.version == 1 and solver.publish_pending  # v2 waits for the verifier's v1
    assert solver.step == 2  # ...but training went on
    verifier.train_on(verifier.poll())
    assert verifier.version == 1
    assert solver.maybe_publish() is not None and solver.version == 2


def test_sync_baseline_steps_every_policy_each_iteration(tmp_path, tiny_policy_dir):
    ctx = make_ctx(tmp_path, tiny_policy_dir, stop={"max_steps": 3})
    assert run_sync(ctx) == 3
    for p in ("solver", "verifier"):
        entries = ctx.ledger().entries(p)
        assert [e.step for e in entries] == [0, 1, 2]
        assert ctx.weights().latest(p) == 3
        assert ctx.checkpoints().latest(p) is not None


def rollout_metrics(ctx: RunContext, policy: str, batch: int) -> dict[str, float]:
    """The rollout metrics one worker batch logged for `policy`."""
    return {r["name"]: r["value"] for r in ctx.ledger().read_metrics().to_pylist()
            if r["component"] == "rollout" and r["policy"] == policy and r["step"] == batch}


def test_a_closed_policy_is_not_started_and_never_stalls_the_others(tmp_path, tiny_policy_dir):
    ctx = make_ctx(tmp_path, tiny_policy_dir)  # max_backlog_batches: 4, max_lead_batches: 2
    traj = ctx.trajectories()
    w = RolloutWorker(ctx, "wA")
    w.refresh_weights()
    for _ in range(4):  # nobody trains: both backlogs fill up
        w.produce_batch()
    t0 = time.time()
    assert w.wait_for_room(should_stop=lambda: time.time() - t0 > 1.0) >= 1.0  # all full: wait
    assert w.admission.play == frozenset()
    solver = Trainer(ctx, "solver")  # the verifier's trainer is down; the solver's trains
    solver.train_on(solver.poll())
    t0 = time.time()
    assert w.wait_for_room(should_stop=lambda: time.time() - t0 > 30.0) < 5.0
    assert w.admission.keep == {"solver"} and not w.admission.feed and w.open == {"solver"}
    before = traj.count("verifier")
    assert w.produce_batch() == 12  # the solver's rows only...
    assert traj.count("verifier") == before and traj.count("solver") == 5 * 12
    held = rollout_metrics(ctx, "verifier", w.batches)
    # ...and the verifier generated nothing: not started, rather than generated and shed.
    assert held["rows"] == 0 and held["rows_not_started"] == 12 and held["rows_fed"] == 0
    assert "gen_s" not in held
    assert rollout_metrics(ctx, "solver", w.batches)["rows_not_started"] == 0
    newest = traj.read_range("solver", 0, 10**9).to_pylist()[-12:]
    env, codec = MathEnv(digits=2), CharCodec.default()
    for r in newest:  # the solver's reward means what it always means: the answer is right
        assert json.loads(r["extras"])["roles_played"] == ["solver"]
        task = env._task(int(r["task_id"][:2]), int(r["task_id"][3:]))
        assert r["reward"] == env.reward(task, codec.decode(r["completion_ids"]))

    # The lead bound: with the verifier held, the solver plays alone at most
    # max_lead_batches (2) batches beyond the verifier's table (4 batches): one more.
    for _ in range(3):
        solver.train_on(solver.poll())  # room in the solver's backlog: only the lead binds
    w.wait_for_room(should_stop=lambda: False)
    assert w.admission.keep == {"solver"}
    w.produce_batch()
    assert traj.count("solver") == 6 * 12
    t0 = time.time()
    assert w.wait_for_room(should_stop=lambda: time.time() - t0 > 1.0) >= 1.0
    assert w.admission.play == frozenset()
    verifier = Trainer(ctx, "verifier")  # the verifier's trainer catches up one step
    verifier.train_on(verifier.poll())
    t0 = time.time()
    assert w.wait_for_room(should_stop=lambda: time.time() - t0 > 30.0) < 5.0
    assert w.admission.keep == {"solver", "verifier"}
    assert w.produce_batch() == 24


def test_a_done_trainers_policy_is_played_as_input_only(tmp_path, tiny_policy_dir):
    """A policy whose table already holds the rows of every step its trainer has left
    (stop.max_steps) is done: a row of it started now would never be trained. The
    verifier still needs the solver's answers, so the solver plays as input only (not
    appended, counted as rows_fed) instead of holding the verifier for ever; a done
    verifier is not started at all."""
    ctx = make_ctx(tmp_path, tiny_policy_dir, stop={"max_steps": 5})  # max_backlog_batches 4
    traj = ctx.trajectories()
    w = RolloutWorker(ctx, "wA")
    w.refresh_weights()
    for _ in range(4):
        w.produce_batch()
    solver = Trainer(ctx, "solver")
    for _ in range(4):
        solver.train_on(solver.poll())  # 1 step left, nothing queued: the solver alone
    w.wait_for_room(should_stop=lambda: False)
    assert w.admission.keep == {"solver"} and not w.admission.feed
    assert w.produce_batch() == 12  # its last step's rows: done
    verifier = Trainer(ctx, "verifier")
    verifier.train_on(verifier.poll())  # 4 steps left, 3 batches queued: one more needed
    t0 = time.time()
    assert w.wait_for_room(should_stop=lambda: time.time() - t0 > 30.0) < 5.0
    assert w.admission.keep == {"verifier"} and w.admission.feed == {"solver"}
    assert w.open == {"verifier"}
    n_solver = traj.count("solver")
    assert w.produce_batch() == 12  # the verifier's rows
    assert traj.count("solver") == n_solver and traj.count("verifier") == 5 * 12
    fed = rollout_metrics(ctx, "solver", w.batches)
    assert fed["rows"] == 0 and fed["rows_fed"] == 12 and fed["rows_not_started"] == 0
    assert fed["gen_s"] > 0
    newest = traj.read_range("verifier", 0, 10**9).to_pylist()[-12:]
    assert {tuple(json.loads(r["extras"])["roles_played"]) for r in newest} == {
        ("solver", "verifier")}
    t0 = time.time()  # both done: every row they will train is in their tables
    assert w.wait_for_room(should_stop=lambda: time.time() - t0 > 1.0) >= 1.0
    assert w.admission.play == frozenset()


MP_FLOW = {
    "name": "mpk",
    "policies": [{"name": "solver", "model": TINY, "warm_start": {"max_steps": 0}},
                 {"name": "verifier", "model": TINY, "warm_start": {"max_steps": 0}}],
    "workflow": {"name": "solver_verifier"},
    "env": {"digits": 2, "eval_size": 40},
    "rollout": {"workers": 1, "prompts_per_batch": 4, "samples_per_prompt": 4,
                "max_backlog_batches": 2},
    "trainer": {"checkpoint_every": 4},
    "stages": [{"name": "staleness", "params": {"max_versions": 4}}, {"name": "group_advantages"}],
    "stop": {"max_steps": 24, "max_minutes": 6, "eval_every_s": 5, "live_eval_size": 20},
}


@pytest.mark.slow
def test_one_trainer_killed_and_resumed_while_the_other_keeps_training(tmp_path):
    from tests.test_kill import paused_trainer, pid_of, start_run, stop_run, wait_until

    # The test hook holds the verifier's trainer after step 5, mid-interval (a checkpoint
    # follows every 4th step): killed there, the successor must roll back the steps it
    # lost and train their rows again. Polling progress for a window instead races it.
    # The solver may play alone as far ahead as the run is long (max_lead_batches), so
    # it has rows to train while the verifier's trainer is down, however far it already
    # was ahead; the default bound (2) is the subject of the test below.
    flow = {**MP_FLOW, "rollout": {**MP_FLOW["rollout"], "max_lead_batches": 40},
            "stop": {**MP_FLOW["stop"], "max_minutes": 30}}  # a loaded machine: steps decide
    gate = tmp_path / "gate"
    launcher, run = start_run(tmp_path, flow, {"ASTRAFLOW_TEST_PAUSE_AT_STEP": "verifier:5",
                                               "ASTRAFLOW_TEST_GATE": str(gate)})

    def step(policy: str) -> int:
        try:
            return json.loads((run / "store" / "_progress" / f"{policy}.json").read_text())["step"]
        except (FileNotFoundError, json.JSONDecodeError):
            return -1

    try:
        pid = paused_trainer(gate, "verifier", 5, 900)
        assert pid == pid_of(run, "trainer-verifier") and step("verifier") == 5
        os.kill(pid, signal.SIGKILL)
        t_kill = time.time()
        wait_until(lambda: pid_of(run, "trainer-verifier") not in (None, pid), 300, "restart", run)
        wait_until(lambda: step("verifier") > 5, 600, "verifier resumed", run)
        out, _ = launcher.communicate(timeout=1200)
    finally:
        stop_run(launcher, run)
    assert launcher.returncode == 0, out
    ctx = RunContext.open(run)
    history = ctx.ledger().history("verifier")
    # The first step after the kill is the successor's (the old process is dead).
    resumed = min(e.time for e in history if e.kind == "step" and e.time > t_kill)
    # While the verifier's trainer was dead and restoring, the solver's kept stepping.
    solver_meanwhile = [e for e in ctx.ledger().history("solver")
                        if e.kind == "step" and t_kill < e.time < resumed]
    assert len(solver_meanwhile) >= 1, (t_kill, resumed)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "max_steps"
    assert summary["restarts"] == {"trainer-solver": 0, "trainer-verifier": 1, "rollout-w0": 0}
    assert set(summary["policies"]) == {"solver", "verifier"}
    assert summary["policies"]["verifier"]["metric"] == "judgement accuracy"
    audit = subprocess.run([sys.executable, "-m", "astraflow", "audit", str(run), "--json"],
                           capture_output=True, text=True, timeout=600)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    counts = json.loads(audit.stdout)["policies"]
    for p in ("solver", "verifier"):
        assert counts[p]["steps"] == MP_FLOW["stop"]["max_steps"] and counts[p]["duplicate_rows"] == 0
        assert counts[p]["violations"] == 0
    # Killed between checkpoints (after step 3 and before step 7), it lost steps 4 and 5:
    # exactly one rollback voids them.
    assert counts["verifier"]["rollbacks"] == 1
    assert counts["verifier"]["voided_steps"] == 2
    assert counts["solver"]["rollbacks"] == 0


@pytest.mark.slow
def test_a_held_back_trainers_policy_is_not_generated_while_the_other_trains(tmp_path):
    """Real processes, real store: the verifier's trainer is held after step 5 (test
    hook). The worker fills the verifier's backlog (2 batches), then stops starting its
    role: the solver plays alone, at most max_lead_batches (2) batches ahead, and keeps
    training; nothing is generated for the verifier and thrown away. Released, the run
    finishes every step of both policies with a clean audit."""
    from tests.test_kill import paused_trainer, start_run, stop_run, wait_until

    flow = {**MP_FLOW, "name": "mpadmit",
            "stop": {**MP_FLOW["stop"], "max_minutes": 30}}  # a loaded machine: steps decide
    batch = flow["rollout"]["prompts_per_batch"] * flow["rollout"]["samples_per_prompt"]
    gate = tmp_path / "gate"
    launcher, run = start_run(tmp_path, flow, {"ASTRAFLOW_TEST_PAUSE_AT_STEP": "verifier:5",
                                               "ASTRAFLOW_TEST_GATE": str(gate),
                                               "ASTRAFLOW_TEST_PAUSE_S": "1800"})

    def progress(policy: str) -> dict:
        try:
            return json.loads((run / "store" / "_progress" / f"{policy}.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {"step": -1}

    def not_started(ctx: RunContext) -> float:
        return sum(r["value"] for r in ctx.ledger().read_metrics(names=["rows_not_started"])
                   .to_pylist() if r["policy"] == "verifier")

    try:
        paused_trainer(gate, "verifier", 5, 600)
        # The held trainer stalls no one. Its 6 consumed batches + a full backlog of 2: the verifier's table stops at 8
        # batches, and the solver alone may reach 8 + 2 = 10 (trained through step 9).
        wait_until(lambda: progress("solver")["step"] >= 9, 600, "the solver training on", run)
        ctx = RunContext.open(run)
        wait_until(lambda: not_started(ctx) > 0, 120, "verifier rows not started", run)
        held_rows = ctx.trajectories().count("verifier")
        assert held_rows == 8 * batch and progress("verifier")["step"] == 5
        solver_rows = ctx.trajectories().count("solver")
        assert 10 * batch <= solver_rows <= 10 * batch + 2 * batch  # backlog: at most 2 more
        assert solver_rows <= held_rows + 2 * batch  # the lead bound
        (gate / "release-verifier-5").touch()
        out, _ = launcher.communicate(timeout=900)
    finally:
        stop_run(launcher, run)
    assert launcher.returncode == 0, out
    assert json.loads((run / "summary.json").read_text())["stop_reason"] == "max_steps"
    ctx = RunContext.open(run)
    rows = ctx.ledger().read_metrics().to_pylist()
    batches: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    for r in rows:
        if r["component"] == "rollout":
            batches[(r["policy"], r["step"])][r["name"]] = r["value"]
    assert not any("rows_shed" in m for m in batches.values())
    held = [m for (p, _), m in batches.items() if p == "verifier" and m["rows_not_started"]]
    assert held  # batches that played the solver alone...
    for m in held:  # ...generated nothing for the verifier
        assert m["rows"] == 0 and m["rows_fed"] == 0 and "gen_s" not in m
    for p in ("solver", "verifier"):  # every generated row is in its table, or counted as fed
        appended = sum(m["rows"] for (q, _), m in batches.items() if q == p)
        assert appended == ctx.trajectories().count(p)
    assert sum(m["rows_fed"] for (q, _), m in batches.items() if q == "verifier") == 0
    audit = subprocess.run([sys.executable, "-m", "astraflow", "audit", str(run), "--json"],
                           capture_output=True, text=True, timeout=300)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    counts = json.loads(audit.stdout)["policies"]
    for p in ("solver", "verifier"):
        assert counts[p]["steps"] == MP_FLOW["stop"]["max_steps"] and counts[p]["violations"] == 0
        assert counts[p]["duplicate_rows"] == 0
