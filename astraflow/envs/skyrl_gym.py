"""`skyrl_gym`: gymnasium-style text environments through skyrl-gym's interface.

Any env skyrl-gym knows by id (`gsm8k`, `gsm8k_multi_turn`, `aime`, ...: its registry)
or a user's `BaseTextEnv` subclass named `module:attr`, on a dataset in SkyRL's row
format: `prompt` (chat messages, or a string for one user message), `reward_spec`
(`ground_truth`, ...), `extra_info`, and optionally `env_class` (a row's own env id).
Each episode is one env instance, made the way SkyRL makes it
(`skyrl_gym.make(id, env_config=..., extras=row)`): `init(prompt)` gives the opening
conversation, `step(model_text)` its observations, reward and `done`; the episode's
reward is the sum of its steps' rewards (skyrl-gym's per-turn rewards), and the env's
`get_metrics()` goes to the row. The held-out split is a hash of each row's key
(`extra_info.index`, else its position), so every process computes the same one.
Needs the `skyrl-gym` extra (`pip install 'astraflow[skyrl-gym]'`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from astraflow import registry
from astraflow.envs.base import Limits, Task, Tool
from astraflow.envs.split import Split, SplitTasks
from astraflow.envs.stepped import NoDemonstrations, Step, message_text


def load_rows(dataset: str | list[dict]) -> list[dict]:
    """Rows from a `.jsonl`/`.json`/`.parquet` file, or from `module:attr` (a list of rows
    or a function returning one)."""
    if isinstance(dataset, list):
        return [dict(r) for r in dataset]
    path = Path(dataset)
    if path.suffix in (".jsonl", ".json", ".parquet"):
        if not path.is_file():
            raise ValueError(f"dataset {dataset!r} does not exist")
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
        text = path.read_text()
        if path.suffix == ".json":
            return list(json.loads(text))
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    obj = registry.load(dataset, f"dataset {dataset!r}")
    rows = obj() if callable(obj) else obj
    return [dict(r) for r in rows]


def _messages(prompt: Any) -> list[dict[str, str]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]


class SkyrlSession:
    """One episode: one skyrl-gym env instance."""

    def __init__(self, env: Any, prompt: list[dict[str, str]]):
        self.env = env
        opened, _info = env.init(prompt)
        self.messages = _messages(opened)

    def step(self, text: str) -> Step:
        out = self.env.step(text)
        return Step(observation=message_text(out.get("observations") or []),
                    reward=float(out.get("reward") or 0.0), done=bool(out.get("done")))

    def close(self, finish: str) -> Step:
        metrics = self.env.get_metrics() if hasattr(self.env, "get_metrics") else {}
        self.env.close()
        return Step(info={"env_metrics": {k: v for k, v in (metrics or {}).items()
                                          if isinstance(v, int | float | str | bool)}})


class SkyrlGymEnv(SplitTasks, NoDemonstrations):
    """A skyrl-gym env by id (or `module:attr`) over a dataset of SkyRL rows."""

    name = "skyrl_gym"

    def __init__(self, dataset: str | list[dict], env: str = "gsm8k",
                 env_config: Mapping[str, Any] | None = None, heldout_fraction: float = 0.1,
                 max_turns: int = 5, max_context_tokens: int | None = None,
                 episode_timeout_s: float | None = 120.0, step_timeout_s: float = 60.0,
                 turn_stops: list[str] | None = None, success_reward: float = 1.0,
                 max_new_tokens: int = 256):
        self.gym = registry.require("skyrl_gym", "skyrl-gym", "env 'skyrl_gym'")
        self.env_id = env
        self.env_config = dict(env_config or {})
        self.rows = load_rows(dataset)
        if not self.rows:
            raise ValueError(f"dataset {dataset!r} has no rows")
        self._by_key: dict[str, dict] = {}
        for i, row in enumerate(self.rows):
            info = row.get("extra_info") or {}
            key = str(info.get("index", i)) if isinstance(info, dict) else str(i)
            if key in self._by_key:
                raise ValueError(f"dataset rows share the key {key!r} (extra_info.index)")
            self._by_key[key] = row
        for ident in {self.env_id} | {str(r["env_class"]) for r in self.rows if r.get("env_class")}:
            self._spec(ident)  # an unknown env id fails here, not in the first episode
        self.split = Split({"rows": sorted(self._by_key)}, heldout_fraction, salt=env)
        self.tools: Mapping[str, Tool] = {}
        self.limits = Limits(max_turns=max_turns, max_context_tokens=max_context_tokens,
                             episode_timeout_s=episode_timeout_s)
        self.turn_stops = tuple(turn_stops or ())
        self.step_timeout_s, self.success_reward = step_timeout_s, success_reward
        self._max_new_tokens = max_new_tokens

    def _spec(self, ident: str) -> Any:
        """skyrl-gym's spec of `ident`: a registered id, or `module:attr` of a class."""
        if ident in self.gym.registry:
            return self.gym.spec(ident)
        if ":" in ident:
            from skyrl_gym.envs.registration import EnvSpec

            registry.load(ident, f"skyrl-gym env {ident!r}")  # our error if it does not import
            return EnvSpec(id=ident, entry_point=ident)
        raise ValueError(f"skyrl-gym has no env {ident!r}: registered are "
                         f"{sorted(self.gym.registry)}, or give `module:attr` of a "
                         "BaseTextEnv subclass")

    def task(self, key: str) -> Task:
        row = self._by_key[key]
        truth = (row.get("reward_spec") or {}).get("ground_truth", "")
        return Task(key, message_text(_messages(row["prompt"])), str(truth), {"key": key})

    def open(self, task: Task) -> SkyrlSession:
        from omegaconf import OmegaConf

        row = self._by_key[task.task_id]
        spec = self._spec(str(row.get("env_class") or self.env_id))
        extras = {k: v for k, v in row.items() if k != "prompt"}
        extras.setdefault("extra_info", {})
        env = self.gym.make(spec, env_config=OmegaConf.create(self.env_config), extras=extras)
        return SkyrlSession(env, _messages(row["prompt"]))

    def max_new_tokens(self) -> int:
        return self._max_new_tokens
