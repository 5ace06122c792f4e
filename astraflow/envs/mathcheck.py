"""Free-form math answers checked with math-verify (the `math-verify` extra): `\\frac{1}{2}`,
`0.5` and `1/2` are one answer, as are `x = 3` and `3`. Imported on first use.

Why the thread check: math-verify bounds its parsing time with `signal.alarm`, which
only the main thread may set, and rollout workers score in threads; off the main thread
the check runs unbounded, so answers are cut to `MAX_CHARS` first.
"""

from __future__ import annotations

import threading

from astraflow import registry

MAX_CHARS = 400
TIMEOUT_S = 5


def equivalent(gold: str, answer: str) -> bool:
    """Whether `answer` states the same value as `gold` (math-verify's `parse` and
    `verify`; an answer without `$…$` or `\\boxed{}` is parsed as a bare expression)."""
    mv = registry.require("math_verify", "math-verify", "math answer checking (math_verify)")
    timeout = TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    want = mv.parse(_latex(gold), parsing_timeout=timeout)
    got = mv.parse(_latex(answer[:MAX_CHARS]), parsing_timeout=timeout)
    if not want or not got:
        return False
    return bool(mv.verify(want, got, timeout_seconds=timeout))


def _latex(text: str) -> str:
    """Bare text as a math environment, so math-verify's LaTeX extraction sees it whole."""
    t = text.strip()
    return t if "$" in t or "\\boxed" in t else f"${t}$"
