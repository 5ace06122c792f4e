"""`search`: questions about a made-up world, answered by searching its encyclopedia.

The corpus is generated from a seed: `entities` invented countries, each with a
capital, a river and a leader, one sentence per fact ("The capital of Velmora is
Tarsk."), in one world or several editions (`worlds`; see `make_corpus`). The names
are invented, so no model knows an answer beforehand. The model calls
`<call>search QUERY</call>`, reads the top results and replies `<answer>Tarsk</answer>`;
reward 1 for an exact match (case and surrounding space ignored). Facts are indexed
with LanceDB's full-text search (BM25), built lazily per process from the seed, so
processes share nothing but the seed. A hashed share of (relation, entity) pairs is
held out: training never asks those questions, though their facts are in the corpus.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from astraflow.envs.base import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    CALL_CLOSE,
    CALL_OPEN,
    TOOL_CLOSE,
    TOOL_OPEN,
    DemoTurn,
    Limits,
    Task,
    Tool,
    ToolResult,
    tool_listing,
)

#: relation → (question, fact sentence); {e} the entity, {v} the value. Every fact
#: names its relation, so `search RELATION ENTITY` ranks it first.
RELATIONS: dict[str, tuple[str, str]] = {
    "capital": ("What is the capital of {e}?", "The capital of {e} is {v}."),
    "river": ("Which river flows through {e}?", "The river of {e} is {v}."),
    "leader": ("Who leads {e}?", "The leader of {e} is {v}."),
}
_CONS, _VOW, _END = "bdfgklmnprstvz", "aeiou", "klnrst"


@dataclass(frozen=True)
class Fact:
    relation: str
    entity: str
    value: str
    world: int = 0

    @property
    def text(self) -> str:
        return RELATIONS[self.relation][1].format(e=self.entity, v=self.value)


def make_corpus(seed: int, entities: int, value_pool: int = 0, worlds: int = 1) -> list[Fact]:
    """`entities` invented countries × every relation, in each of `worlds` editions.

    `value_pool` 0: every value is a fresh invented name, unique across the corpus, so
    the only way to answer is to copy it from the search result. `value_pool` N: each
    relation's values are drawn from N invented names (a country's capital is one of N
    capitals), the way the SQL workload's rows come from fixed name and city lists: a
    1 M-parameter character model learns to pick a name it has seen from the result far
    sooner than to copy an arbitrary string (its warm start stayed at 0% validation
    success for 800 steps with unique values). The value of a (relation, country) pair
    is still random, so only the tool knows it; a guess is right 1 time in N.

    `worlds` W > 1: the same countries in W editions of the encyclopedia, each with its
    own values; a task belongs to one edition and its search sees only that one. The
    question does not say which, so one question has W answers and only reading the
    result pays, as in the SQL workload, where the question does not name its
    database. With one world a small model can memorise the training questions'
    answers instead (measured: 75-100% sampled reward on training questions while
    held-out success stayed at 30-36% over 12 minutes of RL)."""
    rng = random.Random(seed)
    used: set[str] = set()

    def name(syllables: int, end: bool) -> str:
        while True:
            s = "".join(rng.choice(_CONS) + rng.choice(_VOW) for _ in range(syllables))
            s = (s + rng.choice(_END)) if end else s
            if s not in used:
                used.add(s)
                return s.capitalize()

    if value_pool < 0:
        raise ValueError(f"value_pool must be >= 0, got {value_pool}")
    if worlds < 1:
        raise ValueError(f"worlds must be >= 1, got {worlds}")
    pools = {rel: [name(2, True) for _ in range(value_pool)] for rel in RELATIONS} \
        if value_pool else {}
    facts = []
    if worlds == 1:  # the single-world corpus draws exactly what it always drew
        for _ in range(entities):
            e = name(3, False)
            for rel in RELATIONS:
                facts.append(Fact(rel, e, rng.choice(pools[rel]) if pools else name(2, True)))
        return facts
    names = [name(3, False) for _ in range(entities)]
    for w in range(worlds):
        for e in names:
            for rel in RELATIONS:
                facts.append(Fact(rel, e, rng.choice(pools[rel]) if pools else name(2, True), w))
    return facts


def _normal(text: str) -> str:
    return " ".join(text.strip().strip(".").split()).casefold()


class SearchTool:
    """`search(query)`: the top `top_k` facts by BM25 over the corpus, each cut to
    `max_chars`. Thread-safe: the index is built once per process under a lock;
    searches run concurrently."""

    name = "search"
    description = "full-text search of the encyclopedia; returns the best matching facts"

    def __init__(self, facts: list[Fact], *, top_k: int, max_chars: int, timeout_s: float):
        self.facts, self.top_k, self.max_chars, self.timeout_s = facts, top_k, max_chars, timeout_s
        self.worlds = 1 + max((f.world for f in facts), default=0)
        self._lock = threading.Lock()
        self._table = None
        self._pid: int | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None

    def table(self):
        """The indexed table of this process (a forked process builds its own)."""
        with self._lock:
            if self._table is None or self._pid != os.getpid():
                import lancedb
                from lancedb.index import FTS

                self._tmp = tempfile.TemporaryDirectory(prefix="astraflow-search-")
                db = lancedb.connect(self._tmp.name)
                tbl = db.create_table("facts", data=[{"id": i, "world": f.world, "text": f.text}
                                                     for i, f in enumerate(self.facts)])
                tbl.create_index("text", config=FTS())
                self._table, self._pid = tbl, os.getpid()
            return self._table

    def __call__(self, task: Task, argument: str) -> ToolResult:
        t0 = time.monotonic()
        query = " ".join(re.sub(r"[^\w\s]", " ", argument).split())
        if not query:
            return ToolResult("error: empty query", error="empty_query",
                              seconds=time.monotonic() - t0)
        search = self.table().search(query, query_type="fts")
        if self.worlds > 1:  # the task's edition only (a task's data names its world)
            search = search.where(f"world = {int(task.data['world'])}", prefilter=True)
        hits = search.limit(self.top_k).select(["text", "_score"]).to_list()
        out = "\n".join(h["text"][: self.max_chars] for h in hits) or "no results"
        return ToolResult(out, seconds=time.monotonic() - t0)


class SearchEnv:
    """Questions over a seeded corpus, answered with the `search` tool."""

    name = "search"

    def __init__(self, seed: int = 0, entities: int = 400, heldout_fraction: float = 0.2,
                 value_pool: int = 0, worlds: int = 1, top_k: int = 2, max_result_chars: int = 120, max_turns: int = 3,
                 max_context_tokens: int | None = None, episode_timeout_s: float | None = 60.0,
                 tool_timeout_s: float = 10.0, relations: list[str] | None = None):
        if not 0 < heldout_fraction < 1:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        rels = list(relations or RELATIONS)
        unknown = sorted(set(rels) - set(RELATIONS))
        if unknown:
            raise ValueError(f"unknown relations {unknown}: known are {sorted(RELATIONS)}")
        self.seed, self.heldout_fraction, self.relations = seed, heldout_fraction, rels
        self.facts = make_corpus(seed, entities, value_pool, worlds)
        self._by_id = {(f"w{f.world}:" if worlds > 1 else "") + f"{f.relation}:{f.entity}": f
                       for f in self.facts if f.relation in rels}
        self._ids = sorted(self._by_id)
        self.tools: Mapping[str, Tool] = {
            "search": SearchTool(self.facts, top_k=top_k, max_chars=max_result_chars,
                                 timeout_s=tool_timeout_s)}
        self.limits = Limits(max_turns=max_turns, max_context_tokens=max_context_tokens,
                             episode_timeout_s=episode_timeout_s)

    def _heldout(self, task_id: str) -> bool:
        h = hashlib.blake2b(f"{self.seed}/{task_id}".encode(), digest_size=8).digest()
        return int.from_bytes(h, "big") / 2**64 < self.heldout_fraction

    def is_heldout(self, task: Task) -> bool:
        return self._heldout(task.task_id)

    def _task(self, task_id: str) -> Task:
        f = self._by_id[task_id]
        return Task(task_id, RELATIONS[f.relation][0].format(e=f.entity), f.value,
                    {"relation": f.relation, "entity": f.entity, "world": f.world})

    def sample(self, rng: random.Random) -> Task:
        while True:
            tid = rng.choice(self._ids)
            if not self._heldout(tid):
                return self._task(tid)

    def eval_tasks(self, n: int) -> list[Task]:
        held = sorted((t for t in self._ids if self._heldout(t)),
                      key=lambda t: hashlib.blake2b(t.encode(), digest_size=8).digest())
        if len(held) < n:
            raise ValueError(f"only {len(held)} held-out questions exist; lower env.eval_size or "
                             f"raise env.params.entities or heldout_fraction")
        return [self._task(t) for t in held[:n]]

    def instructions(self) -> str:
        return ("Answer a question about a made-up world by searching its encyclopedia. "
                "Tools:\n" + tool_listing(self.tools) + "\nCall one tool per turn, e.g. "
                f"{CALL_OPEN}search capital Oronia{CALL_CLOSE}; its result comes back as "
                f"{TOOL_OPEN}…{TOOL_CLOSE}. When you know the answer, reply "
                f"{ANSWER_OPEN}ANSWER{ANSWER_CLOSE} with only the name.")

    def reward(self, task: Task, answer: str | None) -> float:
        return 1.0 if answer is not None and _normal(answer) == _normal(task.answer) else 0.0

    def demonstration(self, task: Task, rng: random.Random) -> list[DemoTurn]:
        """Search `RELATION ENTITY`, read the result (the real tool's output), answer."""
        query = f"{task.data['relation']} {task.data['entity']}"
        found = self.tools["search"](task, query)
        return [DemoTurn("model", f"{CALL_OPEN}search {query}{CALL_CLOSE}"),
                DemoTurn("tool", found.output),
                DemoTurn("model", f"{ANSWER_OPEN}{task.answer}{ANSWER_CLOSE}")]

    def max_new_tokens(self) -> int:
        """A call or an answer of the tiny model (one token per character), with room."""
        return 48
