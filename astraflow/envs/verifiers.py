"""`verifiers`: an environment of the `verifiers` library (0.4, `verifiers.v1`).

Loaded by id or module as verifiers loads one (`vf.load_environment`): `taskset` is an
installed taskset package or any module exporting a `Taskset` subclass in `__all__`
(`import_path` puts its folder on `sys.path`). Its tasks are the dataset (held out by a
hash of `Task.key`). Its protocol is verifiers' chat loop: a model turn may call the
task's and taskset's toolsets (their `@vf.tool` methods, through an in-process MCP
server built from each toolset), results come back as the next input, and a reply
without a call ends the episode. Its rubric is the reward: `Task.score` runs the task's
`@vf.reward` functions (and judges) on a `vf.Trace` of the episode; the row gets each
component (`rubric`), its weight and the `@vf.metric`s. A call is written
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes; the system prompt
says so). The `verifiers` extra has its own venv: `scripts/setup-verifiers-env.sh`.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Mapping
from typing import Any

from astraflow.envs.base import Limits, Task, Tool
from astraflow.envs.split import Split, SplitTasks
from astraflow.envs.stepped import NoDemonstrations, Step

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
CALL_FORMAT = ('To call a tool, reply with <tool_call>{"name": NAME, "arguments": {...}}'
               "</tool_call>; its result comes back. Reply without a call to finish.")


def _require() -> Any:
    try:
        import verifiers.v1 as vf
    except ModuleNotFoundError as err:
        raise ValueError(f"env 'verifiers' needs the 'verifiers' extra, which is not installed "
                         f"({err}); it cannot share an env with `launch` (uvicorn pins): "
                         "bash scripts/setup-verifiers-env.sh and run from .venv-verifiers") from None
    return vf


def parse_calls(text: str) -> list[tuple[str, Any]]:
    """The turn's tool calls: (name, arguments) each; arguments is the error text when
    the call is not valid JSON with a `name`."""
    calls: list[tuple[str, Any]] = []
    for body in _CALL.findall(text):
        try:
            obj = json.loads(body)
            calls.append((str(obj["name"]), obj.get("arguments") or {}))
        except (ValueError, KeyError, TypeError) as err:
            calls.append(("", f"error: the call is not JSON with a name ({err}); resend it"))
    return calls


class VerifiersSession:
    """One episode of one verifiers task: the chat loop, its tools and its rubric."""

    def __init__(self, env: VerifiersEnv, task: Any):
        from mcp.server.mcpserver import MCPServer

        vf = env.vf
        self.env, self.task, self.vf = env, task, vf
        self.server = MCPServer("astraflow")
        for toolset in (type(task).toolsets(task.config)
                        + type(env.taskset).toolsets(env.taskset.config)):
            toolset.register(self.server)
        self.tools = asyncio.run(self.server.list_tools())
        system = task.data.system_prompt or ""
        if self.tools:
            listing = "\n".join(f"- {t.name}: {t.description or ''} arguments "
                                f"{json.dumps(t.input_schema.get('properties', {}))}"
                                for t in self.tools)
            system = f"{system}\n\nTools:\n{listing}\n{CALL_FORMAT}".strip()
        prompt = task.data.prompt
        user = ([{"role": "user", "content": prompt}] if isinstance(prompt, str) else
                [{"role": m.role, "content": str(m.content)} for m in prompt or []])
        self.messages = ([{"role": "system", "content": system}] if system else []) + user
        self.log: list[Any] = [vf.SystemMessage(content=system)] if system else []
        self.log += [vf.UserMessage(content=m["content"]) for m in user]
        self.calls = 0

    def step(self, text: str) -> Step:
        vf = self.vf
        calls = parse_calls(text)
        ids = [f"call{self.calls + i}" for i in range(len(calls))]
        self.calls += len(calls)
        self.log.append(vf.AssistantMessage(content=text, tool_calls=[
            vf.ToolCall(id=i, name=name, arguments=json.dumps(args))
            for i, (name, args) in zip(ids, calls, strict=True) if name] or None))
        if not calls:
            return Step(done=True)  # the chat loop ends at a reply without a call
        outputs = []
        for i, (name, args) in zip(ids, calls, strict=True):
            out = args if not name else asyncio.run(self._call(name, args))
            self.log.append(vf.ToolMessage(tool_call_id=i, content=out, name=name or None))
            outputs.append(out)
        return Step(observation="\n".join(outputs))

    async def _call(self, name: str, args: Any) -> str:
        if not isinstance(args, dict):
            return "error: tool arguments must be a JSON object"
        try:
            res = await self.server.call_tool(name, args)
        except Exception as err:  # an unknown tool or bad arguments: the model reads why
            return f"error: {err}"
        text = "\n".join(getattr(c, "text", "") for c in getattr(res, "content", []) or [])
        return f"error: {text}" if getattr(res, "is_error", False) else text

    def close(self, finish: str) -> Step:
        """Score the episode with the task's rubric (`Task.score` on a `vf.Trace`)."""
        from verifiers.v1.graph import MessageNode
        from verifiers.v1.trace import AgentInfo, TraceTask

        vf, task = self.vf, self.task
        nodes = [MessageNode(parent=i - 1 if i else None, message=m,
                             sampled=isinstance(m, vf.AssistantMessage))
                 for i, m in enumerate(self.log)]
        trace = vf.Trace(task=TraceTask(type=type(task).__name__, data=task.data,
                                        key=task.key, hash=task.hash),
                         agent=AgentInfo(config=vf.AgentConfig()), nodes=nodes,
                         stop_condition=finish, is_completed=True, ok=finish == "done")
        asyncio.run(task.score(trace))
        rubric = {k: r.score for k, r in trace.rewards.items() if r is not None}
        return Step(reward=trace.reward, info={
            "rubric": rubric,
            "rubric_weights": {k: r.weight for k, r in trace.rewards.items() if r is not None},
            "rubric_metrics": {k: v for k, v in trace.metrics.items() if v is not None}})


class VerifiersEnv(SplitTasks, NoDemonstrations):
    """A verifiers environment by taskset id or module (see the module docstring)."""

    name = "verifiers"

    def __init__(self, taskset: str, taskset_args: Mapping[str, Any] | None = None,
                 env_id: str = "", import_path: str | None = None, max_tasks: int = 100000,
                 heldout_fraction: float = 0.1, max_turns: int = 4,
                 max_context_tokens: int | None = None, episode_timeout_s: float | None = 120.0,
                 step_timeout_s: float = 60.0, success_reward: float = 1.0,
                 max_new_tokens: int = 128):
        if import_path and import_path not in sys.path:
            sys.path.insert(0, import_path)
        self.vf = vf = _require()
        config = vf.resolve_env_config({"id": env_id, "taskset": {"id": taskset,
                                                                    **dict(taskset_args or {})}})
        self.vf_env = vf.load_environment(config)
        self.taskset = self.vf_env.taskset
        tasks = self.taskset if self.taskset.bounded else self.taskset.take(max_tasks)
        self._tasks = {str(t.key): t for t in tasks}
        if not self._tasks:
            raise ValueError(f"verifiers taskset {taskset!r} has no tasks")
        self.split = Split({"tasks": sorted(self._tasks)}, heldout_fraction, salt=taskset)
        self.tools: Mapping[str, Tool] = {}
        self.limits = Limits(max_turns=max_turns, max_context_tokens=max_context_tokens,
                             episode_timeout_s=episode_timeout_s)
        self.turn_stops = ("</tool_call>",)
        self.step_timeout_s, self.success_reward = step_timeout_s, success_reward
        self._max_new_tokens = max_new_tokens

    def task(self, key: str) -> Task:
        data = self._tasks[key].data
        return Task(key, data.prompt_text, str(getattr(data, "answer", "") or ""), {"key": key})

    def open(self, task: Task) -> VerifiersSession:
        return VerifiersSession(self, self._tasks[task.task_id])

    def max_new_tokens(self) -> int:
        return self._max_new_tokens
