"""The code workload: write a one-line Python function for a spec; reward = the fraction
of the task's hidden tests it passes.

Tasks come from a dozen parameterised families ("f(xs): the sum of the numbers in xs
divisible by 3", ...), each solved by one short expression; a hash of the task key
holds a slice out for evaluation (`split.py`). Hidden tests are computed in the worker
from a trusted reference function. Grading runs the answer in the sandbox
(`sandbox.py`) on the inputs only and compares what it prints (JSON on a line tagged
with a per-run nonce) with the expected outputs here, which never enter the sandbox.
Tool: `<call>run CODE</call>` runs CODE in the sandbox and shows its output (or the
last line of its error), so the model can try its function before it answers.
"""

from __future__ import annotations

import json
import random
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass

from astraflow.envs import humaneval
from astraflow.envs.base import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    CALL_CLOSE,
    CALL_OPEN,
    DemoTurn,
    Limits,
    Task,
    ToolResult,
    tool_listing,
)
from astraflow.envs.sandbox import RunResult, SandboxLimits, run_python
from astraflow.envs.split import Split, SplitTasks


@dataclass(frozen=True)
class Family:
    name: str
    arg: str  # "xs": a list of ints, "s": a string
    params: Callable[[], list[tuple]]
    spec: Callable[..., str]
    solution: Callable[..., str]
    """The one-line answer, `f=lambda ARG:EXPR`."""
    ref: Callable[..., Callable]
    """The same function, trusted, run here to compute expected outputs."""


_L = string.ascii_lowercase
FAMILIES: tuple[Family, ...] = (
    Family("sumdiv", "xs", lambda: [(k,) for k in range(2, 10)],
           lambda k: f"the sum of the numbers in xs divisible by {k}",
           lambda k: f"f=lambda xs:sum(x for x in xs if x%{k}==0)",
           lambda k: lambda xs: sum(x for x in xs if x % k == 0)),
    Family("countgt", "xs", lambda: [(t,) for t in range(-5, 21)],
           lambda t: f"how many numbers in xs are greater than {t}",
           lambda t: f"f=lambda xs:sum(x>{t} for x in xs)",
           lambda t: lambda xs: sum(x > t for x in xs)),
    Family("add", "xs", lambda: [(k,) for k in range(-9, 10) if k],
           lambda k: f"xs with {k} added to each number",
           lambda k: f"f=lambda xs:[x+{k} for x in xs]",
           lambda k: lambda xs: [x + k for x in xs]),
    Family("mul", "xs", lambda: [(k,) for k in range(2, 10)],
           lambda k: f"xs with each number multiplied by {k}",
           lambda k: f"f=lambda xs:[x*{k} for x in xs]",
           lambda k: lambda xs: [x * k for x in xs]),
    Family("maxplus", "xs", lambda: [(k,) for k in range(-9, 10)],
           lambda k: f"the largest number in xs plus {k}",
           lambda k: f"f=lambda xs:max(xs)+{k}",
           lambda k: lambda xs: max(xs) + k),
    Family("last", "xs", lambda: [(k,) for k in range(1, 10)],
           lambda k: f"the last {k} numbers of xs",
           lambda k: f"f=lambda xs:xs[-{k}:]",
           lambda k: lambda xs: xs[-k:]),
    Family("revwords", "s", lambda: [(sep,) for sep in (" ", "-", ",", "+")],
           lambda sep: f"the words of s in reverse order, joined by '{sep}'",
           lambda sep: f"f=lambda s:'{sep}'.join(s.split()[::-1])",
           lambda sep: lambda s: sep.join(s.split()[::-1])),
    Family("count", "s", lambda: [(c,) for c in _L],
           lambda c: f"how many times '{c}' occurs in s",
           lambda c: f"f=lambda s:s.count('{c}')",
           lambda c: lambda s: s.count(c)),
    Family("countin", "s", lambda: [(a + b,) for a in _L for b in _L if a < b],
           lambda cs: f"how many characters of s are in '{cs}'",
           lambda cs: f"f=lambda s:sum(c in '{cs}' for c in s)",
           lambda cs: lambda s: sum(c in cs for c in s)),
    Family("replace", "s", lambda: [(a, b) for a in _L for b in _L if a != b],
           lambda a, b: f"s with every '{a}' replaced by '{b}'",
           lambda a, b: f"f=lambda s:s.replace('{a}','{b}')",
           lambda a, b: lambda s: s.replace(a, b)),
    Family("first", "s", lambda: [(k,) for k in range(1, 10)],
           lambda k: f"the first {k} characters of s",
           lambda k: f"f=lambda s:s[:{k}]",
           lambda k: lambda s: s[:k]),
    Family("repeat", "s", lambda: [(k,) for k in range(2, 6)],
           lambda k: f"s repeated {k} times",
           lambda k: f"f=lambda s:s*{k}",
           lambda k: lambda s: s * k),
)
_BY_NAME = {f.name: f for f in FAMILIES}


def _key(family: Family, params: tuple) -> str:
    return f"{family.name}:" + ",".join(str(p) for p in params)


def _inputs(family: Family, params: tuple, rng: random.Random, n: int) -> list:
    """`n` distinct inputs; lists never empty (max of [] is an error, not a test)."""
    out: list = []
    letters = "".join(str(p) for p in params if isinstance(p, str) and p.isalpha())
    while len(out) < n:
        if family.arg == "xs":
            x: object = [rng.randint(-9, 20) for _ in range(rng.randint(1, 7))]
        else:  # words of letters, biased to the letters the task is about
            pool = _L[:8] + letters * 3
            x = " ".join("".join(rng.choice(pool) for _ in range(rng.randint(1, 5)))
                         for _ in range(rng.randint(1, 4)))
        if x not in out:
            out.append(x)
    return out


def _program(code: str, inputs: list, nonce: str) -> str:
    """The answer, then a harness printing f's outputs (or the error per input) as JSON."""
    return (f"{code}\n\n"
            "import json as _j\n"
            f"_r = []\nfor _x in _j.loads({json.dumps(json.dumps(inputs))}):\n"
            "    try:\n        _r.append(['ok', f(_x)])\n"
            "    except Exception as _e:\n        _r.append(['error', type(_e).__name__])\n"
            f"print({nonce!r} + _j.dumps(_r, default=repr))\n")


def _normal(v: object) -> object:
    return json.loads(json.dumps(v))  # tuples as lists, as the sandbox's JSON has them


class RunTool:
    """`<call>run CODE</call>`: run CODE in the sandbox, show its output."""

    name = "run"
    description = "run Python code in a sandbox and see what it prints"

    def __init__(self, limits: SandboxLimits, max_chars: int):
        self.limits, self.max_chars = limits, max_chars
        self.timeout_s = limits.timeout_s + 3.0  # sandbox start and kill grace

    def __call__(self, task: Task, argument: str) -> ToolResult:
        r = run_python(argument, self.limits)
        return format_run(r, self.max_chars)


def format_run(r: RunResult, max_chars: int) -> ToolResult:
    """What the model sees of a run: stdout's tail, then the error's last line."""
    out = r.stdout.rstrip("\n")
    error = None
    if r.timed_out:
        error = f"timeout after {r.seconds:.1f}s"
    elif r.truncated:
        error = "output too long"
    elif r.exit_code != 0:
        lines = r.stderr.strip().splitlines()
        error = lines[-1] if lines else f"exit {r.exit_code}"
    text = out + (("\n" if out else "") + error if error else "")
    if len(text) > max_chars:
        text = "..." + text[-(max_chars - 3):]
    return ToolResult(output=text, error=error, seconds=r.seconds)


EVAL_SETS = ("families", "humaneval")


class CodeEnv(SplitTasks):
    """One-line Python functions with hidden tests, graded in the sandbox. `eval_set`:
    the held-out tasks of the families (default), or HumanEval's problems (`humaneval`,
    all-or-nothing: a complete function that passes the problem's `check`)."""

    name = "code"

    def __init__(self, heldout_fraction: float = 0.1, seed: int = 0, *, tests: int = 5,
                 families: list[str] | None = None, max_turns: int = 3,
                 run_timeout_s: float = 5.0, tool_output_chars: int = 200,
                 episode_timeout_s: float | None = 60.0, eval_set: str = "families"):
        if eval_set not in EVAL_SETS:
            raise ValueError(f"eval_set must be one of {EVAL_SETS}, got {eval_set!r}")
        self.eval_set = eval_set
        self.humaneval = humaneval.problems() if eval_set == "humaneval" else []
        unknown = set(families or ()) - set(_BY_NAME)
        if unknown:
            raise ValueError(f"unknown code families {sorted(unknown)}; known: {sorted(_BY_NAME)}")
        self.families = [_BY_NAME[n] for n in families] if families else list(FAMILIES)
        self.seed, self.n_tests = seed, tests
        self.sandbox = SandboxLimits(timeout_s=run_timeout_s)
        self.split = Split({f.name: [_key(f, p) for p in f.params()] for f in self.families},
                           heldout_fraction, salt=f"code{seed}")
        self.tools = {"run": RunTool(self.sandbox, tool_output_chars)}
        self.limits = Limits(max_turns=max_turns, episode_timeout_s=episode_timeout_s)

    @staticmethod
    def _params(key: str) -> tuple:
        family = _BY_NAME[key.partition(":")[0]]
        return next(p for p in family.params() if _key(family, p) == key)

    def task(self, key: str) -> Task:
        family = _BY_NAME[key.partition(":")[0]]
        params = self._params(key)
        rng = random.Random(f"{self.seed}|{key}")
        inputs = _inputs(family, params, rng, self.n_tests)
        ref = family.ref(*params)
        expected = [_normal(ref(x)) for x in inputs]
        return Task(task_id=key, prompt=f"f({family.arg}): {family.spec(*params)}",
                    answer=family.solution(*params),
                    data={"inputs": inputs, "expected": expected})

    def eval_tasks(self, n: int) -> list[Task]:
        if self.eval_set == "humaneval":
            return humaneval.tasks(self.humaneval, n)
        return super().eval_tasks(n)

    def is_heldout(self, task: Task) -> bool:
        return bool(task.data.get("humaneval")) or super().is_heldout(task)

    def instructions(self) -> str:
        what = ("Write the Python function f in one line, as f=lambda ..."
                if self.eval_set == "families" else "Write the Python function the task "
                "names (f: in one line, as f=lambda ...; others: the complete function)")
        return (f"{what}\n"
                f"{tool_listing(self.tools)}\n"
                f"Answer: {ANSWER_OPEN}f=lambda ...{ANSWER_CLOSE}")

    def grade(self, task: Task, code: str) -> tuple[float, RunResult]:
        """Fraction of hidden tests passed, and the sandbox run that decided it."""
        nonce = "#" + secrets.token_hex(8) + ":"
        if task.data.get("humaneval"):
            r = run_python(humaneval.program(task, code, nonce), self.sandbox)
            return (1.0 if r.ok and nonce in r.stdout.splitlines() else 0.0), r
        r = run_python(_program(code, list(task.data["inputs"]), nonce), self.sandbox)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith(nonce)]
        if not r.ok or len(lines) != 1:
            return 0.0, r
        expected = task.data["expected"]
        results = json.loads(lines[0][len(nonce):])  # the harness's line: well formed
        passed = sum(status == "ok" and got == want
                     for (status, got), want in zip(results, expected, strict=True))
        return passed / len(expected), r

    def reward(self, task: Task, answer: str | None) -> float:
        if not answer:
            return 0.0
        return self.grade(task, answer)[0]

    def demonstration(self, task: Task, rng: random.Random) -> list[DemoTurn]:
        """The answer, half the time after a `run` of it on the first hidden input. The
        tool's output is what that run prints, computed here from the trusted reference
        (no sandbox per demonstration; tests replay demonstrations through the tool)."""
        turns: list[DemoTurn] = []
        if rng.random() < 0.5:
            x = task.data["inputs"][0]
            family = _BY_NAME[task.task_id.partition(":")[0]]
            value = family.ref(*self._params(task.task_id))(x)
            code = f"{task.answer};print(f({x!r}))"
            turns.append(DemoTurn("model", f"{CALL_OPEN}run {code}{CALL_CLOSE}"))
            turns.append(DemoTurn("tool", str(value)))
        turns.append(DemoTurn("model", f"{ANSWER_OPEN}{task.answer}{ANSWER_CLOSE}"))
        return turns
