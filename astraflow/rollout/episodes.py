"""The endpoint's episode book: every call of an agent's episode, kept as exact rows.

    call (episode E, policy P) ──► extends E's open row of P?  yes: stitch onto it;  no: new row
    reward(E, r, group) ──► rows wait in their group ──► complete (or old) ──► written
    no reward within the timeout ──► E dropped, counted

A call *extends* a row when its prompt is that row's whole context followed by new
messages (the agent sent back the reply it got and appended tool or user messages).
The row then grows by the new messages (mask 0) and the completion (mask 1): the model
was given exactly these ids, the earlier ones never re-tokenised. Any other prompt
(history edited or summarised, another system prompt or tool list) starts a new row:
the ids the earlier turns were sampled after are no longer a prefix of this turn's
context, so one row could not hold what the model saw at each turn.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


@dataclass
class Row:
    """One row being built: the prompt, then (ids, logprobs or None) segments."""

    policy: str
    prompt_ids: list[int]
    segments: list[tuple[list[int], list[float] | None]] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    """The weight version of each sampled segment, in order."""
    finish: str = "stop"
    api: str = "chat"
    last: dict[str, Any] = field(default_factory=dict)
    """What the last call sent and got (messages, tools, reply / prompt text): what the
    next call must extend to be stitched on."""

    def context_len(self) -> int:
        return len(self.prompt_ids) + sum(len(ids) for ids, _ in self.segments)

    def context(self) -> list[int]:
        out = list(self.prompt_ids)
        for ids, _ in self.segments:
            out.extend(ids)
        return out


@dataclass
class Episode:
    id: str
    touched: float
    rows: list[Row] = field(default_factory=list)
    open: dict[str, Row] = field(default_factory=dict)
    """Per policy, the row the next call may extend."""


@dataclass
class Plan:
    """A call's prompt: `ids` (all the model reads) and, when it extends `row`, the
    `new` ids between the row's context and this turn."""

    ids: list[int]
    row: Row | None = None
    new: list[int] = field(default_factory=list)
    base_len: int = 0


class Unknown(KeyError):
    """No such open episode: it never made a recorded call, or it was dropped."""


class Ended(ValueError):
    """The episode already has its reward (or was dropped): it takes no more calls."""


#: Ended episodes remembered, so a late call or a second reward is refused, not
#: taken as a new episode of the same id.
REMEMBERED = 100_000


class Book:
    """Open episodes, rewarded groups waiting to be written, and the drop count.
    Thread-safe: requests record, a background loop writes and expires."""

    def __init__(self, *, group_size: int, timeout_s: float):
        self.group_size, self.timeout_s = group_size, timeout_s
        self.episodes: dict[str, Episode] = {}
        self.groups: dict[str, tuple[float, list[tuple[Row, float, str, str]]]] = {}
        self.dropped = 0
        self.dropped_rows = 0
        self.ended: OrderedDict[str, str] = OrderedDict()
        """Episode id → `rewarded` or `dropped`, the newest REMEMBERED of them."""
        self._lock = threading.Lock()

    def _check_open(self, episode: str) -> None:
        how = self.ended.get(episode)
        if how is not None:
            raise Ended(f"episode {episode!r} has ended ({how}): start a new episode")

    def _end(self, episode: str, how: str) -> None:
        self.ended[episode] = how
        if len(self.ended) > REMEMBERED:
            self.ended.popitem(last=False)

    def open_row(self, episode: str, policy: str) -> Row | None:
        with self._lock:
            self._check_open(episode)
            ep = self.episodes.get(episode)
            return None if ep is None else ep.open.get(policy)

    def record(self, episode: str, plan: Plan, completion: list[int], logprobs: list[float],
               version: int, finish: str, policy: str, api: str, last: dict[str, Any]) -> Row:
        """Add one call's turn: stitched onto `plan.row` when that row has not grown since
        the plan was made (a concurrent call of the same episode may have), else a new
        row whose prompt is everything the model read."""
        with self._lock:
            self._check_open(episode)
            ep = self.episodes.setdefault(episode, Episode(episode, time.monotonic()))
            row = plan.row
            if row is not None and ep.open.get(policy) is row and \
                    row.context_len() == plan.base_len:
                if plan.new:
                    row.segments.append((list(plan.new), None))
            else:
                row = Row(policy, list(plan.ids), api=api)
                ep.rows.append(row)
            row.segments.append((list(completion), list(logprobs)))
            row.versions.append(version)
            row.finish, row.api, row.last = finish, api, last
            ep.open[policy] = row
            ep.touched = time.monotonic()
            return row

    def reward(self, episode: str, reward: float, group: str | None, task: str | None) -> int:
        """Close an episode with its reward; its rows join `group` (default: alone).
        Returns its rows."""
        with self._lock:
            if self.ended.get(episode) == "rewarded":
                raise Ended(f"episode {episode!r} already has its reward")
            ep = self.episodes.pop(episode, None)
            if ep is None:
                raise Unknown(episode)
            self._end(episode, "rewarded")
            key = group or f"episode-{episode}"
            started, members = self.groups.setdefault(key, (time.monotonic(), []))
            members.extend((r, reward, task or key, episode) for r in ep.rows)
            return len(ep.rows)

    def take_ready(self, *, flush_all: bool = False) -> list[tuple[str, list[tuple[Row, float, str, str]]]]:
        """Groups ready to write: `group_size` episodes rewarded, alone, or waiting longer
        than the timeout (or every group, `flush_all`: the worker is stopping)."""
        now = time.monotonic()
        with self._lock:
            ready = []
            for key, (started, members) in list(self.groups.items()):
                episodes = {m[3] for m in members}
                if (flush_all or key.startswith("episode-") or len(episodes) >= self.group_size
                        or now - started > self.timeout_s):
                    ready.append((key, members))
                    del self.groups[key]
            return ready

    def expire(self) -> int:
        """Drop episodes with no reward `timeout_s` after their last call; returns how many."""
        now = time.monotonic()
        with self._lock:
            late = [e for e in self.episodes.values() if now - e.touched > self.timeout_s]
            for e in late:
                del self.episodes[e.id]
                self._end(e.id, "dropped")
                self.dropped_rows += len(e.rows)
            self.dropped += len(late)
            return len(late)

    def open_count(self) -> int:
        with self._lock:
            return len(self.episodes)


def row_dict(row: Row, reward: float, group: str, task: str, episode: str, *,
             worker: str, region: str, host: str, role: str) -> dict[str, Any]:
    """A trajectory row (stores/schema.py) of one built row: mask 1 and the behaviour
    logprobs on sampled tokens, mask 0 and logprob 0 on what the model only read. Its
    `behavior_version` is its oldest turn's (what staleness bounds count from); each
    turn's own version is in `extras.turn_versions`."""
    ids: list[int] = []
    lps: list[float] = []
    mask: list[int] = []
    for seg, seg_lps in row.segments:
        ids.extend(seg)
        lps.extend([0.0] * len(seg) if seg_lps is None else seg_lps)
        mask.extend([0 if seg_lps is None else 1] * len(seg))
    return {
        "traj_id": uuid.uuid4().hex, "group_id": f"{worker}-{group}", "policy": row.policy,
        "behavior_version": min(row.versions), "prompt_ids": row.prompt_ids,
        "completion_ids": ids, "behavior_logprobs": lps, "loss_mask": mask,
        "reward": float(reward), "env": "endpoint", "task_id": task, "worker": worker,
        "region": region, "created_at": datetime.now(UTC),
        "extras": json.dumps({"host": host, "role": role, "finish_reason": row.finish,
                              "episode": episode, "api": row.api, "turns": len(row.versions),
                              "turn_versions": row.versions}),
    }
