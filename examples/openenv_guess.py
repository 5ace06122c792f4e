"""A text game served with OpenEnv's server API, for examples/openenv.yaml and its test.

The env picks a number from 1 to `HIGH` (from the reset seed), the model guesses, and
the env answers "higher" or "lower" until the guess is right (reward 1, done) or
`TRIES` guesses are spent (done, reward 0). Served as OpenEnv serves an env locally:
    uvicorn examples.openenv_guess:app --host 127.0.0.1 --port 8000
(`env.params.app: examples.openenv_guess:app` makes the `openenv` env start it.)
"""

from __future__ import annotations

import random
import re
from typing import Any
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

HIGH, TRIES = 16, 4


class GuessAction(Action):
    message: str = Field(..., description="The model's turn; its first integer is the guess")


class GuessObservation(Observation):
    text: str = Field(default="", description="What the env says")


class GuessEnvironment(Environment):
    """One game per session: the server makes one instance per WebSocket client."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.secret = 1

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **kwargs: Any) -> GuessObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.secret = random.Random(seed).randint(1, HIGH)
        return GuessObservation(text=f"I picked a number from 1 to {HIGH}. Guess it: reply "
                                     f"with one number. You have {TRIES} guesses.")

    def step(self, action: GuessAction, timeout_s: float | None = None,
             **kwargs: Any) -> GuessObservation:  # type: ignore[override]
        self._state.step_count += 1
        found = re.search(r"-?\d+", action.message)
        guess = int(found.group()) if found else None
        if guess == self.secret:
            return GuessObservation(text="Right!", done=True, reward=1.0)
        if self._state.step_count >= TRIES:
            return GuessObservation(text=f"Out of guesses: it was {self.secret}.", done=True,
                                    reward=0.0)
        hint = ("Reply with one number." if guess is None
                else "Higher." if guess < self.secret else "Lower.")
        return GuessObservation(text=hint, done=False, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess",
                 max_concurrent_envs=256)
