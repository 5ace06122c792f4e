"""How `tool_agent` plays a stepped env (astraflow.envs.stepped): open, step, close.

Every call into the env's library runs on the workflow's tool pool, so a slow server
delays only its own episode, and each is bounded by the env's `step_timeout_s`. A
session that raises or overruns ends its episode with finish reason `env_error` and
the reason in the row (`env_error`); the batch and the worker go on. The reward of an
episode is the sum of its steps' rewards plus what `close` adds.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, wait
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

from astraflow.envs.base import Task
from astraflow.envs.stepped import Session, Step
from astraflow.workflows.base import EvalItem

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from astraflow.envs.base import Limits
    from astraflow.models.codec import Codec
    from astraflow.workflows.tool_agent import Episode


def _step(session: Session, text: str) -> Step:
    try:
        return session.step(text)
    except Exception as err:  # the library's failure is this episode's, not the worker's
        return Step(error=f"{type(err).__name__}: {err}", done=True)


def _close(session: Session, finish: str) -> Step:
    try:
        return session.close(finish)
    except Exception as err:
        return Step(error=f"close: {type(err).__name__}: {err}")


class SteppedPlay:
    """`ToolAgent`'s stepped-env half (a mixin: it uses the agent's pool and codec)."""

    env: Any
    codec: Codec
    limits: Limits
    max_tool_chars: int
    _pool: ThreadPoolExecutor

    def open_sessions(self, tasks: list[Task], k: int) -> list[Session]:
        """`k` fresh sessions of each task, opened concurrently, task-major, within the
        env's `open_timeout_s` (if it has one: starting a server takes longer than a
        step) or `step_timeout_s`. An env that cannot open one raises: without its
        opening conversation there is no prompt."""
        futures = [self._pool.submit(self.env.open, t) for t in tasks for _ in range(k)]
        limit = float(getattr(self.env, "open_timeout_s", self.env.step_timeout_s))
        wait(futures, timeout=limit)
        failed = [f for f in futures if not f.done() or f.exception() is not None]
        if failed:  # close what did open, then say why the rest did not
            for f in futures:
                if f.done() and f.exception() is None:
                    self._pool.submit(_close, f.result(), "env_error")
            if not failed[0].done():
                raise TimeoutError(f"env {self.env.name!r}: a session did not open within "
                                   f"{limit}s")
            raise RuntimeError(f"env {self.env.name!r} could not open a session: "
                               f"{failed[0].exception()}") from failed[0].exception()
        return [f.result() for f in futures]

    def session_prompt(self, session: Session) -> list[int]:
        """The opening conversation as prompt ids: through the chat template for chat
        models, its contents joined by blank lines otherwise."""
        if self.codec.is_chat:
            return self.codec.encode_chat([dict(m) for m in session.messages])
        return self.codec.encode("\n\n".join(m["content"] for m in session.messages))

    def submit_step(self, e: Episode, text: str) -> None:
        """Send the model's turn to the env; the episode waits on the result."""
        assert e.session is not None
        now = time.monotonic()
        e.events.append("step")
        e.call_started = now
        deadline = now + self.env.step_timeout_s
        if e.timeout_s is not None:
            deadline = min(deadline, e.started + e.timeout_s)
        e.pending, e.call_deadline = self._pool.submit(_step, e.session, text), deadline

    def fold_step(self, e: Episode, res: Any, now: float) -> None:
        """Apply the env's answer (a `Step`; a `ToolResult` when it overran) to `e`."""
        if not isinstance(res, Step):
            res = Step(error=f"no answer within {now - e.call_started:.1f}s", done=True)
        e.tool_s += now - e.call_started
        e.events.append("result")
        e.reward += float(res.reward)
        e.info.update(res.info)
        if res.error is not None:
            e.finish, e.info["env_error"] = "env_error", res.error
            return
        if res.done:
            e.finish = "done"
            return
        if e.timeout_s is not None and now - e.started > e.timeout_s:
            e.finish = "timeout"
            return
        if e.turns >= self.limits.max_turns:
            e.finish = "max_turns"
            return
        if not res.observation:
            return
        ids = self.codec.encode_tool_turn(res.observation[: self.max_tool_chars])
        own = e.segments[-1][0] if e.segments else []
        if own and ids and own[-1] == ids[0] and own[-1] in self.codec.stop_ids:
            ids = ids[1:]  # the turn ended at the end-of-turn token the reply opens with
        limit = self.limits.max_context_tokens
        if limit is not None and len(e.prompt) + e.length + len(ids) >= limit:
            e.add(ids[: max(limit - len(e.prompt) - e.length, 0)], None)
            e.finish = "context"
        else:
            e.add(ids, None)

    def close_sessions(self, eps: list[Episode]) -> None:
        """Close every session concurrently; what `close` returns joins the episode."""
        futures: list[tuple[Episode, Future]] = [
            (e, self._pool.submit(_close, e.session, e.finish or "done"))
            for e in eps if e.session is not None]
        for e, f in futures:
            try:
                res = f.result(timeout=self.env.step_timeout_s)
            except FutureTimeout:
                res = Step(error=f"close: no answer within {self.env.step_timeout_s}s")
            e.reward += float(res.reward)
            e.info.update(res.info)
            if res.error is not None:
                e.info.setdefault("env_error", res.error)
            e.session = None

    def solved(self, reward: float) -> bool:
        return reward >= self.env.success_reward

    def stepped_items(self, tasks: list[Task]) -> list[EvalItem]:
        """Held-out checks: `score` plays each task's session; solved = reward reached.
        An item's text check cannot judge a session, so it refuses to."""
        def check(text: str) -> bool:
            raise ValueError(f"env {self.env.name!r} is stepped: its held-out items are "
                             "scored by playing their sessions (ToolAgent.score)")
        return [EvalItem(t.prompt, check, {"task": t}) for t in tasks]
