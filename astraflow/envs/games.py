"""textarena's multi-player text games as an env: a task is one game start, played to
its end by the `arena` workflow, which binds each player seat to a policy of the flow
or to a fixed opponent.

The game is textarena's own, made by `textarena.make(game)` with its registered
wrappers, and untouched: its observations are what the players read, its parser
judges every move, and its rules handle invalid moves (a two-player game asks the
player to resubmit once, then scores the game lost). What this module adds is the
bookkeeping a trainer needs: which text of the (cumulative) observation a seat has
not read yet, the game's outcome as a reward in [0, 1], and a fixed opponent that
plays a uniformly random legal move (for the games listed in `RANDOM_MOVES`).
The library is the `textarena` extra, imported when the env is built.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from astraflow import registry
from astraflow.envs.base import DemoTurn, Limits, Task, Tool

#: The marker textarena's states put in the message that follows an invalid move.
INVALID_MARK = "attempted an invalid move"
#: Held-out game seeds start here; training draws seeds below it.
EVAL_SEED_BASE = 1_000_000_000


def _tictactoe(env: Any) -> list[str]:
    board = env.state.game_state["board"]
    return [f"[{r * 3 + c}]" for r in range(3) for c in range(3) if board[r][c] == ""]


def _connect_four(env: Any) -> list[str]:
    board = env.state.game_state["board"]
    return [f"[col {c}]" for c in range(len(board[0])) if board[0][c] == "."]


def _nim(env: Any) -> list[str]:
    piles = env.state.game_state["piles"]
    return [f"[{i} {q}]" for i, n in enumerate(piles) for q in range(1, n + 1)]


#: Game family (the id before `-v`) → its legal moves in the current state, as the
#: random opponent (and the warm start's demonstrations) play them.
RANDOM_MOVES: dict[str, Callable[[Any], list[str]]] = {
    "TicTacToe": _tictactoe, "ConnectFour": _connect_four, "Nim": _nim,
}


def family(game: str) -> str:
    """`TicTacToe-v0-train` → `TicTacToe`."""
    return game.split("-v")[0]


@dataclass
class Game:
    """One textarena game in play. `seen` is, per seat, the observation text already
    shown: textarena's LLM wrapper returns a seat's whole history each turn, so a
    seat's row grows by the new suffix only (or by the whole observation, for a
    wrapper that re-renders it)."""

    env: Any
    seed: int
    seen: dict[int, str] = field(default_factory=dict)
    done: bool = False
    invalid: dict[int, int] = field(default_factory=dict)
    """Per seat, moves textarena refused (it asks for a resubmission, then ends the game)."""

    def observe(self) -> tuple[int, str]:
        """The seat to move and the text it has not read yet."""
        seat, obs = self.env.get_observation()
        obs = obs if isinstance(obs, str) else str(obs)
        old = self.seen.get(seat, "")
        new = obs[len(old):] if obs.startswith(old) else obs
        self.seen[seat] = obs
        if INVALID_MARK in new:
            self.invalid[seat] = self.invalid.get(seat, 0) + 1
        return seat, new

    def step(self, action: str) -> None:
        done, _ = self.env.step(action)
        self.done = bool(done)

    def outcome(self) -> tuple[dict[int, float], dict[int, dict[str, Any]]]:
        """textarena's rewards per seat (1 win, 0 draw, -1 loss) and its game info."""
        rewards, info = self.env.close()
        return {int(k): float(v) for k, v in (rewards or {}).items()}, dict(info or {})


class TextArenaEnv:
    """One textarena game (`game`: a registered id such as `TicTacToe-v0`; `kwargs`:
    its constructor's arguments, e.g. Nim's `piles`). Tasks are game seeds: training
    draws seeds below `EVAL_SEED_BASE`, held-out games use the seeds from it on, and
    a task's `seat` is the seat its first role takes. `opponent: random` needs the
    game's family in `RANDOM_MOVES`."""

    name = "textarena"
    tools: Mapping[str, Tool] = {}

    def __init__(self, game: str = "TicTacToe-v0", kwargs: Mapping[str, Any] | None = None, *,
                 num_players: int = 2, max_turns: int = 30, max_context_tokens: int | None = None,
                 max_new_tokens: int = 16, stop: tuple[str, ...] | list[str] = ("]",)):
        self._ta = registry.require("textarena", "textarena", "env 'textarena'")
        from textarena.envs.registration import ENV_REGISTRY

        if game not in ENV_REGISTRY:
            close = [g for g in ENV_REGISTRY if family(g) == family(game)]
            raise ValueError(f"textarena has no game {game!r}"
                             + (f"; its variants: {sorted(close)}" if close else ""))
        if num_players < 2:
            raise ValueError("num_players must be >= 2: the arena is for multi-player games")
        self.game, self.kwargs, self.num_players = game, dict(kwargs or {}), num_players
        self.limits = Limits(max_turns=max_turns, max_context_tokens=max_context_tokens)
        self._max_new_tokens, self.stop = max_new_tokens, tuple(stop)

    def new_game(self, seed: int) -> Game:
        """A fresh game, reset with `seed` (textarena seeds the global `random` with it)."""
        env = self._ta.make(self.game, **self.kwargs)
        env.reset(num_players=self.num_players, seed=seed)
        return Game(env, seed)

    def random_move(self, game: Game, rng: random.Random) -> str:
        """A uniformly random legal move: the fixed opponent's play."""
        moves = RANDOM_MOVES.get(family(self.game))
        if moves is None:
            raise ValueError(f"no random opponent for {self.game!r}: it knows the legal "
                             f"moves of {sorted(RANDOM_MOVES)} only")
        legal = moves(game.env)
        if not legal:
            raise RuntimeError(f"{self.game} seed {game.seed}: no legal move in a game not over")
        return rng.choice(legal)

    def sample(self, rng: random.Random) -> Task:
        seed = rng.randrange(EVAL_SEED_BASE)
        return self._task(seed, rng.randrange(self.num_players))

    def eval_tasks(self, n: int) -> list[Task]:
        """Seeds `EVAL_SEED_BASE + i`, seats taken in turn, so each seat is held out
        equally often (a first player wins more)."""
        return [self._task(EVAL_SEED_BASE + i, i % self.num_players) for i in range(n)]

    def _task(self, seed: int, seat: int) -> Task:
        return Task(f"{self.game}:{seed}:{seat}", "", "", {"seed": seed, "seat": seat})

    def instructions(self) -> str:
        return ""  # the game's own prompt states its rules

    def reward(self, task: Task, answer: str | None) -> float:
        raise ValueError("a textarena game is scored by playing it: use the `arena` workflow")

    def demonstration(self, task: Task, rng: random.Random) -> list[DemoTurn]:
        raise ValueError("a textarena game is demonstrated by the `arena` workflow")

    def max_new_tokens(self) -> int:
        return self._max_new_tokens


def seat_reward(rewards: Mapping[int, float], seat: int) -> float:
    """textarena's reward of `seat` (1 win, 0 draw, -1 loss) mapped to [0, 1]; a game
    cut short (no rewards) counts as a draw."""
    r = rewards.get(seat, 0.0)
    return min(max((r + 1.0) / 2.0, 0.0), 1.0)
