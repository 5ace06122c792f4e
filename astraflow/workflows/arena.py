"""`arena`: multi-player textarena games (astraflow.envs.games), each player seat bound
to a role (a policy of the flow) or to the fixed random opponent.

    game seed, seat s ──► seat s: role A;  seat 1-s: role B (`train_against: each_other`)
                                           or the random opponent (`opponent`)
    each turn: the seat's unread observation (mask 0) ──► its move (sampled, mask 1)
               ──► textarena's step (its parser, its invalid-move rule)

One row per role per game (its first observation is the prompt), so a player's turns
are rows of its own policy. Reward: the seat's outcome, win 1, draw 0.5, loss 0. A
group is one role's games of one task from one seat (a first mover wins more often);
with `each_other` a task's k games rotate the seats. The held-out metric of every
role is its greedy win rate against the random opponent, seats taken in turn.
Warm-start demonstrations: the role's seat plays random legal moves (format and
legality, not strategy).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from astraflow.workflows.base import Actor, Demo, EvalItem, Part, Workflow

if TYPE_CHECKING:
    from astraflow.envs.base import Task
    from astraflow.envs.games import Game, TextArenaEnv
    from astraflow.rollout.generation import Generation

#: generate(role, prompts) -> one completion per prompt, ended at the env's stop strings.
Generate = Callable[[str, list[list[int]]], "Generation"]
MODES = ("each_other", "opponent")
OPPONENT = "random"


@dataclass
class Seat:
    """One seat's row while its game is played; `role` None is the fixed opponent."""

    role: str | None
    prompt: list[int] | None = None
    segments: list[tuple[list[int], list[float] | None]] = field(default_factory=list)
    length: int = 0
    turns: int = 0

    def read(self, ids: list[int]) -> None:
        if self.prompt is None:
            self.prompt = ids
        else:
            self.segments.append((ids, None))
            self.length += len(ids)

    def context(self) -> list[int]:
        assert self.prompt is not None
        return self.prompt + [t for ids, _ in self.segments for t in ids]


@dataclass
class Match:
    """One game of one task: its seats, the opponent's dice, and how it ended."""

    task: Task
    index: int
    game: Game
    seats: dict[int, Seat]
    rng: random.Random
    sample: int = 0
    finish: str | None = None
    """None while in play; `over` (textarena ended it), `max_turns` or `context`."""


class Arena(Workflow):
    def __init__(self, env, codec, *, samples_per_prompt: int,
                 players: Sequence[str] = ("player_0", "player_1"),
                 train_against: str = "each_other", opponent: str = OPPONENT, **params: Any):
        super().__init__(env, codec, samples_per_prompt=samples_per_prompt, **params)
        from astraflow.envs.games import TextArenaEnv

        if not isinstance(env, TextArenaEnv):
            raise ValueError("workflow 'arena' plays textarena games: set env.name: textarena")
        self.game_env: TextArenaEnv = env
        self.players = self.role_names({"players": players})
        if train_against not in MODES:
            raise ValueError(f"workflow.params.train_against must be one of {MODES}")
        if opponent != OPPONENT:
            raise ValueError(f"workflow.params.opponent: only {OPPONENT!r} (a uniformly random "
                             f"legal move) is built in")
        if train_against == "each_other" and len(self.players) != env.num_players:
            raise ValueError(f"train_against: each_other seats one player per seat: "
                             f"{len(self.players)} players for {env.num_players} seats")
        self.mode = train_against

    @classmethod
    def role_names(cls, params: Mapping[str, Any]) -> tuple[str, ...]:
        players = tuple(params.get("players", ("player_0", "player_1")))
        if not players or len(set(players)) != len(players):
            raise ValueError("workflow.params.players: one or more distinct role names")
        return players

    def metric_name(self, role: str) -> str:
        return f"win rate vs {OPPONENT}"

    def default_max_new_tokens(self, role: str) -> int:
        return self.game_env.max_new_tokens()

    # -- episodes ----------------------------------------------------------------
    def episodes(self, tasks: list[Task], actor: Actor) -> list[Part]:
        env = self.game_env

        def generate(role: str, prompts: list[list[int]]) -> Generation:
            return actor.generate(role, prompts, samples=1, stop=env.stop,
                                  max_new_tokens=self.max_new_tokens(role))

        matches: list[Match] = []
        for i, t in enumerate(tasks):
            lineups = ([list(self.players)] if self.mode == "each_other"
                       else [[r] for r in self.players])
            for lineup in lineups:
                for j in range(self.k):
                    matches.append(self._match(t, i, lineup, j, turn=j))
        self.play(matches, generate)
        return [p for m in matches for p in self.parts(m)]

    def _match(self, task: Task, index: int, lineup: list[str], sample: int, turn: int = 0
               ) -> Match:
        """A game of `task` with `lineup[0]` at the task's seat moved on by `turn`, the
        rest after it; the seats left over go to the opponent. Playing sample j with
        turn j gives each player of a lineup the first move in some of a task's games,
        so every player moves in some game even when its opponents' refused moves end
        the others early (textarena scores two refused moves in a row as a loss)."""
        n, seat = self.game_env.num_players, (int(task.data["seat"]) + turn) % self.game_env.num_players
        seed = int(task.data["seed"])
        seats = {s: Seat(None) for s in range(n)}
        for k, role in enumerate(lineup):
            seats[(seat + k) % n] = Seat(role)
        # The opponent's dice depend on the game, not on who plays it: every role meets
        # the same opponent moves in the same held-out game.
        who = "".join("o" if s.role is None else "p" for s in seats.values())
        rng = random.Random(f"{seed}:{sample}:{who}")
        return Match(task, index, self.game_env.new_game(seed), seats, rng, sample)

    def play(self, matches: list[Match], generate: Generate) -> None:
        """Play every match to its end: each round, every unfinished game advances the
        opponent's moves until a role is to move, then each role moves in all its games
        at once (one generate call per role)."""
        env = self.game_env
        limit = env.limits.max_context_tokens
        while True:
            todo: dict[str, list[tuple[Match, Seat]]] = {}
            for m in matches:
                seat = self._advance(m)
                if seat is None:
                    continue
                if seat.turns >= env.limits.max_turns:
                    m.finish = "max_turns"
                elif limit is not None and len(seat.context()) + self.max_new_tokens(
                        seat.role or "") > limit:
                    m.finish = "context"
                else:
                    todo.setdefault(seat.role or "", []).append((m, seat))
            if not todo:
                return
            for role, waiting in todo.items():
                gen = generate(role, [s.context() for _, s in waiting])
                for (m, s), comp, lps in zip(waiting, gen.completions, gen.logprobs, strict=True):
                    s.segments.append((list(comp), list(lps)))
                    s.length += len(comp)
                    s.turns += 1
                    m.game.step(self.codec.decode(comp))

    def _advance(self, m: Match) -> Seat | None:
        """Play the opponent's moves; the seat of the role to move next, its unread
        observation added to its row (None: the game is over)."""
        while m.finish is None:
            if m.game.done:
                m.finish = "over"
                break
            sid, text = m.game.observe()
            seat = m.seats[sid]
            if seat.role is None:
                m.game.step(self.game_env.random_move(m.game, m.rng))
                continue
            seat.read(self.encode_prompt(text) if seat.prompt is None
                      else self.codec.encode_tool_turn(text))
            return seat
        return None

    def outcomes(self, m: Match) -> dict[int, tuple[str, float, str]]:
        """Per seat: how its game ended (`win`, `loss`, `draw`, `invalid` when its own
        refused move lost it, `max_turns`, `context`), textarena's reward and reason."""
        rewards, info = m.game.outcome()
        out = {}
        for sid in m.seats:
            r = rewards.get(sid, 0.0)
            if m.finish != "over":
                why = m.finish or "over"
            elif info.get(sid, {}).get("invalid_move"):
                why = "invalid"
            else:
                why = "win" if r > 0 else "loss" if r < 0 else "draw"
            out[sid] = (why, r, str(info.get(sid, {}).get("reason", "")))
        return out

    def parts(self, m: Match) -> list[Part]:
        """One part per role that moved at least once (a seat whose game ended before its
        first move has nothing to train and is counted in the others' `unplayed_seats`)."""
        from astraflow.envs.games import seat_reward

        ends = self.outcomes(m)
        rewards = {sid: r for sid, (_, r, _) in ends.items()}
        unplayed = sum(1 for s in m.seats.values() if s.role is not None and s.turns == 0)
        names = {sid: s.role or OPPONENT for sid, s in m.seats.items()}
        out = []
        for sid, s in m.seats.items():
            if s.role is None or s.turns == 0:
                continue
            assert s.prompt is not None
            why, raw, reason = ends[sid]
            extras = {"game": self.game_env.game, "seed": m.game.seed, "seat": sid,
                      "match": f"{m.task.task_id}:{m.sample}",
                      "opponents": [names[o] for o in sorted(names) if o != sid],
                      "textarena_reward": raw, "turns": s.turns,
                      "invalid_moves": m.game.invalid.get(sid, 0),
                      "reason": reason,
                      "unplayed_seats": unplayed}
            out.append(Part.from_segments(
                s.role, m.task.task_id, f"{s.role}:t{m.index}:s{sid}", s.prompt, s.segments,
                seat_reward(rewards, sid) if m.finish == "over" else 0.5, why, extras))
        return out

    # -- warm start and evaluation ----------------------------------------------
    def demo(self, role: str, rng: random.Random) -> Demo:
        """A game in which `role`'s seat plays uniformly random legal moves against the
        random opponent: its moves are the targets (mask 1), the game's text context."""
        env = self.game_env
        while True:
            m = self._match(env.sample(rng), 0, [role], 0)
            m.rng = random.Random(rng.random())
            ids: list[int] = []
            mask: list[int] = []
            while (seat := self._advance(m)) is not None and seat.turns < env.limits.max_turns:
                if seat.segments:
                    ids.extend(seat.segments[-1][0])
                    mask.extend([0] * len(seat.segments[-1][0]))
                move = env.random_move(m.game, rng)
                own = self._text_ids(move)
                seat.segments.append((own, [0.0] * len(own)))
                seat.turns += 1
                ids.extend(own)
                mask.extend([1] * len(own))
                m.game.step(move)
            seat = next(s for s in m.seats.values() if s.role == role)
            if seat.prompt is not None and any(mask):
                return Demo(seat.prompt, ids, mask)

    def _text_ids(self, text: str) -> list[int]:
        """A move's text as ids that continue a context (no BOS)."""
        tok = getattr(self.codec, "tokenizer", None)
        if tok is not None:
            return [int(i) for i in tok.encode(text, add_special_tokens=False)]
        ids = self.codec.encode(text)
        bos = getattr(self.codec, "bos_id", None)
        return ids[1:] if ids and bos is not None and ids[0] == bos else ids

    def items(self, role: str, tasks: list[Task], rng: random.Random) -> list[EvalItem]:
        """One game per task against the random opponent; `check` is given the outcome."""
        return [EvalItem("", lambda outcome: outcome == "win", {"task": t}) for t in tasks]

    def score(self, role: str, engine: Any, items: list[EvalItem], batch: int = 500) -> float:
        """Win rate of greedy play against the random opponent."""
        from astraflow.rollout.generation import generate_with_stops

        def generate(_: str, prompts: list[list[int]]) -> Generation:
            return generate_with_stops(engine, prompts, self.game_env.stop, greedy=True,
                                       max_new_tokens=self.max_new_tokens(role))

        won = 0
        for i in range(0, len(items), batch):
            chunk = items[i : i + batch]
            matches = [self._match(it.data["task"], n, [role], 0)  # type: ignore[index]
                       for n, it in enumerate(chunk)]
            self.play(matches, generate)
            for it, m in zip(chunk, matches, strict=True):
                sid = next(s for s, seat in m.seats.items() if seat.role == role)
                won += bool(it.check(self.outcomes(m)[sid][0]))
        return won / max(len(items), 1)
