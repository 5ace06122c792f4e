"""The textarena env and the `arena` workflow against the real textarena: seats bound to
policies, rows in each policy's LanceDB table, textarena's own invalid-move rule, the
fixed random opponent, and a short `astraflow run`."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import defaultdict

import pytest
import yaml

pytest.importorskip("textarena")

from astraflow import registry  # noqa: E402
from astraflow.envs.games import INVALID_MARK, TextArenaEnv  # noqa: E402
from astraflow.models.tokenizer import CharCodec, build_char_tokenizer  # noqa: E402
from astraflow.rollout.generation import Generation  # noqa: E402
from astraflow.rollout.worker import RolloutWorker  # noqa: E402
from astraflow.train.trainer import Trainer  # noqa: E402
from astraflow.workflows.arena import Arena  # noqa: E402
from tests.runs import seeded_run  # noqa: E402

TINY = {"alphabet": "ascii", "max_positions": 1024, "hidden_size": 64, "layers": 2,
        "heads": 2, "intermediate_size": 128}
NIM = {"name": "textarena", "params": {"game": "Nim-v0", "kwargs": {"piles": [2, 3]},
                                       "max_new_tokens": 6}, "eval_size": 10}


@pytest.fixture
def ascii_policy_dir(tmp_path):
    from astraflow.models.factory import save_policy, tiny_llama

    d = tmp_path / "policy"
    d.mkdir()
    save_policy(tiny_llama(hidden_size=64, layers=2, heads=2, intermediate_size=128,
                           alphabet="ascii", max_positions=1024), build_char_tokenizer("ascii"), d)
    return d


def two_policy_ctx(tmp_path, policy_dir, **params):
    flow = {"name": "arena", "policies": [{"name": "alice", "model": TINY},
                                          {"name": "bob", "model": TINY}],
            "workflow": {"name": "arena", "params": {"players": ["alice", "bob"], **params}},
            "env": NIM, "rollout": {"prompts_per_batch": 3, "samples_per_prompt": 2},
            "stages": [{"name": "group_advantages"}]}
    ctx = seeded_run(tmp_path / "run", flow, policy_dir)
    ws = ctx.weights()  # seeded_run publishes the primary policy only
    staging = ws.staging_dir("bob")
    for f in policy_dir.iterdir():
        (staging / f.name).write_bytes(f.read_bytes())
    ws.publish("bob", staging, step=0, version=0)
    return ctx


def test_each_seat_is_a_policy_and_its_turns_are_rows_of_that_policy(tmp_path, ascii_policy_dir):
    ctx = two_policy_ctx(tmp_path, ascii_policy_dir)
    w = RolloutWorker(ctx, "w0")
    assert w.refresh_weights()
    traj, codec = ctx.trajectories(), CharCodec.default("ascii")
    # A seat whose game ends before its first move has no row (see below), so a batch
    # may hold fewer rows than its 3 tasks x 2 games; the trainer waits for a batch's worth.
    n = 0
    for _ in range(6):
        n += w.produce_batch()
        if min(traj.count(p) for p in ("alice", "bob")) >= ctx.flow.batch_rows("bob"):
            break
    rows = {p: traj.read_range(p, 0, 10**9).to_pylist() for p in ("alice", "bob")}
    assert n == len(rows["alice"]) + len(rows["bob"]) > 0
    games: dict[str, dict[str, dict]] = defaultdict(dict)
    for policy, prow in rows.items():
        assert prow, f"no row of {policy}"
        for r in prow:
            x = json.loads(r["extras"])
            assert r["policy"] == policy and x["role"] == policy and x["game"] == "Nim-v0"
            assert x["opponents"] == [{"alice": "bob", "bob": "alice"}[policy]]
            # The prompt is textarena's own first observation for this seat.
            assert codec.decode(r["prompt_ids"]).startswith(
                f"\n[GAME] Welcome to Nim, Player {x['seat']}!")
            mask, comp = r["loss_mask"], r["completion_ids"]
            assert sum(mask) > 0 and len(r["behavior_logprobs"]) == len(comp)
            assert all(lp == 0.0 for lp, m in zip(r["behavior_logprobs"], mask, strict=True) if m == 0)
            # Own moves (mask 1) alternate with what the game showed (mask 0, as <tool>…).
            runs, cur = [], None
            for tok, m in zip(comp, mask, strict=True):
                if cur is None or cur[0] != m:
                    cur = (m, [])
                    runs.append(cur)
                cur[1].append(tok)
            assert runs[0][0] == 1 and sum(m for m, _ in runs) == x["turns"]
            for m, toks in runs:
                if m == 0:
                    text = codec.decode(toks)
                    assert text.startswith("<tool>") and text.endswith("</tool>")
            assert x["finish_reason"] in {"win", "loss", "draw", "invalid"}
            assert r["reward"] == {"win": 1.0, "draw": 0.5}.get(x["finish_reason"], 0.0)
            assert r["reward"] == (x["textarena_reward"] + 1) / 2
            games[x["match"]][policy] = r
    # A random model's moves are refused; two refusals lose the game before the other
    # seat moves, which then has no row (counted as unplayed). Seats rotate over a
    # task's games, so both policies move first somewhere and both get rows.
    for g in games.values():
        for r in g.values():
            assert json.loads(r["extras"])["unplayed_seats"] == 2 - len(g)
    # GRPO groups never mix the two policies (nor seats).
    assert not ({r["group_id"] for r in rows["alice"]} & {r["group_id"] for r in rows["bob"]})
    # Bob's trainer learns from bob's own move tokens only.
    tr = Trainer(ctx, "bob")
    sl = tr.poll()
    assert sl is not None and sl.num_rows >= ctx.flow.batch_rows("bob")
    own = sum(sum(m) for m in sl.rows.column("loss_mask").to_pylist())
    assert tr.train_on(sl).metrics["tokens"] == own
    assert tr.version == 1 and ctx.weights().latest("alice") == 0


def scripted(codec, moves_by_role):
    """A generate function that plays given texts (a stand-in for a sampled turn, so a
    test can choose the move; textarena still judges it)."""
    played = defaultdict(int)

    def generate(role, prompts):
        comps = []
        for _ in prompts:
            text = moves_by_role[role][min(played[role], len(moves_by_role[role]) - 1)]
            played[role] += 1
            comps.append(codec.encode(text)[1:])
        return Generation(comps, [[-0.5] * len(c) for c in comps], ["stop"] * len(comps))

    return generate


def test_invalid_moves_are_judged_by_textarena(ascii_policy_dir):
    codec = CharCodec.default("ascii")
    env = TextArenaEnv("TicTacToe-v0", max_new_tokens=4)
    wf = Arena(env, codec, samples_per_prompt=1, players=["alice"], train_against="opponent")
    task = env.eval_tasks(1)[0]  # seat 0: alice moves first
    # Cell 9 is off the board: textarena asks once for another move, then ends the game.
    m = wf._match(task, 0, ["alice"], 0)
    wf.play([m], scripted(codec, {"alice": ["[9]", "[9]"]}))
    (part,) = wf.parts(m)
    x = part.extras
    assert part.finish_reason == "invalid" and part.reward == 0.0 and x["turns"] == 2
    assert x["textarena_reward"] == -1.0 and x["invalid_moves"] == 1
    shown = codec.decode(part.completion_ids)
    assert INVALID_MARK in shown and "Must be between 0 and 8" in shown
    # One refused move, then a legal one: the game goes on.
    m = wf._match(task, 0, ["alice"], 0)
    wf.play([m], scripted(codec, {"alice": ["[9]", "[4]", "[0]", "[1]", "[2]", "[3]", "[5]",
                                            "[6]", "[7]", "[8]"]}))
    (part,) = wf.parts(m)
    assert part.extras["invalid_moves"] >= 1 and part.extras["turns"] >= 3
    assert "placed their symbol (O) in cell 4" in codec.decode(part.completion_ids)


def lowest_free_cell(codec):
    """A TicTacToe player that claims the lowest free cell it is shown."""
    def generate(role, prompts):
        comps = []
        for p in prompts:
            free = codec.decode(p).rsplit("Available Moves:", 1)[1].split("'")[1]
            comps.append(codec.encode(free)[1:])
        return Generation(comps, [[-0.1] * len(c) for c in comps], ["stop"] * len(comps))

    return generate


def test_two_policies_play_each_other():
    codec = CharCodec.default("ascii")
    env = TextArenaEnv("TicTacToe-v0", max_new_tokens=4)
    wf = Arena(env, codec, samples_per_prompt=2, players=["alice", "bob"])
    tasks = [env.sample(random.Random(s)) for s in range(3)]
    matches = [wf._match(t, i, ["alice", "bob"], j, turn=j) for i, t in enumerate(tasks)
               for j in range(2)]
    wf.play(matches, lowest_free_cell(codec))
    for m in matches:
        parts = {p.role: p for p in wf.parts(m)}
        a, b = parts["alice"], parts["bob"]
        assert a.extras["seat"] != b.extras["seat"] and a.extras["match"] == b.extras["match"]
        assert a.reward + b.reward == 1.0 and a.group != b.group
        # Lowest-free-cell play: the first mover takes 0, 2, 4, 6 (a diagonal) and wins.
        first = a if a.extras["seat"] == 0 else b
        assert first.finish_reason == "win" and first.extras["turns"] == 4
    # Sample j moves the lineup on by j seats: each player moves first in some game.
    assert {(m.index, m.seats[0].role) for m in matches} == \
        {(i, r) for i in range(3) for r in ("alice", "bob")}


def test_fixed_opponent_mode_plays_random_legal_moves(ascii_policy_dir):
    codec = CharCodec.default("ascii")
    env = TextArenaEnv("TicTacToe-v0", max_new_tokens=4)
    wf = Arena(env, codec, samples_per_prompt=3, players=["alice", "bob"],
               train_against="opponent")
    tasks = [env.sample(random.Random(s)) for s in range(4)]
    matches = [wf._match(t, i, [r], j) for i, t in enumerate(tasks) for r in ("alice", "bob")
               for j in range(3)]
    lowest = lowest_free_cell(codec)
    wf.play(matches, lowest)
    parts = [p for m in matches for p in wf.parts(m)]
    assert len(parts) == 4 * 2 * 3  # k games of each task for each player
    for m in matches:
        opp = next(s for s, seat in m.seats.items() if seat.role is None)
        assert m.game.invalid.get(opp, 0) == 0  # the random opponent only plays legal moves
    for p in parts:
        assert p.extras["opponents"] == ["random"] and p.extras["invalid_moves"] == 0
        assert p.finish_reason in {"win", "loss", "draw"}
    # Its dice are seeded per game: the same game replays the same way.
    again = [wf._match(t, i, [r], j) for i, t in enumerate(tasks) for r in ("alice", "bob")
             for j in range(3)]
    wf.play(again, lowest)
    assert [p.completion_ids for m in again for p in wf.parts(m)] == \
        [p.completion_ids for p in parts]
    # Held-out: win rate against the random opponent, seats taken in turn.
    held = env.eval_tasks(6)
    assert [t.data["seat"] for t in held] == [0, 1, 0, 1, 0, 1]
    assert wf.metric_name("alice") == "win rate vs random"


class LowestFreeCellEngine:
    """An engine (the protocol `score` plays through) that claims the lowest free cell."""

    def __init__(self, codec):
        self.codec, self.play = codec, lowest_free_cell(codec)

    def generate(self, prompts, *, max_new_tokens, greedy=False, **_):
        return self.play("", prompts)


def test_held_out_score_is_the_win_rate_against_the_random_opponent():
    codec = CharCodec.default("ascii")
    env = TextArenaEnv("TicTacToe-v0", max_new_tokens=4)
    wf = Arena(env, codec, samples_per_prompt=1, players=["alice", "bob"])
    items = wf.eval_items("alice", 20)
    engine = LowestFreeCellEngine(codec)
    score = wf.score("alice", engine, items)
    # The same play scores the same for every role: the opponent's dice are the game's.
    assert score == wf.score("bob", engine, wf.eval_items("bob", 20)) == wf.score(
        "alice", engine, items)
    wins = 0
    for n, it in enumerate(items):
        m = wf._match(it.data["task"], n, ["alice"], 0)
        wf.play([m], lowest_free_cell(codec))
        seat = next(s for s, st in m.seats.items() if st.role == "alice")
        wins += wf.outcomes(m)[seat][0] == "win"
    assert score == wins / 20 and 0 < score < 1


def test_a_missing_extra_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "textarena", None)
    with pytest.raises(ValueError, match=r"pip install 'astraflow\[textarena\]'"):
        registry.check("env", "textarena")
    with pytest.raises(ModuleNotFoundError, match=r"'textarena' extra"):
        TextArenaEnv("TicTacToe-v0")


def test_bad_params_say_what_to_fix():
    with pytest.raises(ValueError, match="TicTacToe-v0"):
        TextArenaEnv("TicTacToe-v9")
    env, codec = TextArenaEnv("Nim-v0"), CharCodec.default("ascii")
    with pytest.raises(ValueError, match="one player per seat"):
        Arena(env, codec, samples_per_prompt=2, players=["solo"])
    with pytest.raises(ValueError, match="random"):
        Arena(env, codec, samples_per_prompt=2, opponent="frozen")
    with pytest.raises(ValueError, match="no random opponent"):
        env = TextArenaEnv("KuhnPoker-v0")
        env.random_move(env.new_game(0), random.Random(0))


@pytest.mark.slow
def test_a_short_run_through_the_cli(tmp_path):
    flow = {"name": "ta", "seed": 0,
            "policies": [{"name": "alice", "model": TINY, "warm_start": {
                "max_steps": 4, "batch_size": 4, "check_every": 2, "check_size": 10}},
                {"name": "bob", "model": TINY, "warm_start": {"init_from": "alice",
                                                              "max_steps": 0}}],
            "workflow": {"name": "arena", "params": {"players": ["alice", "bob"]}},
            "env": NIM,
            "rollout": {"prompts_per_batch": 2, "samples_per_prompt": 2,
                        "max_backlog_batches": 2},
            "trainer": {"threads": 1},
            "stages": [{"name": "group_advantages"}],
            "stop": {"max_steps": 2, "max_minutes": 3, "eval_every_s": 5, "live_eval_size": 10}}
    p = tmp_path / "ta.yaml"
    p.write_text(yaml.safe_dump(flow))
    r = subprocess.run([sys.executable, "-m", "astraflow", "run", str(p), "--runs",
                        str(tmp_path / "runs")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((tmp_path / "runs" / "ta" / "summary.json").read_text())
    for name in ("alice", "bob"):
        pol = summary["policies"][name]
        assert pol["metric"] == "win rate vs random" and pol["heldout_items"] == 10
        assert pol["ledger"]["steps"] >= 1 and 0.0 <= pol["accuracy_final"] <= 1.0
