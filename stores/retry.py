"""Bounded retries for store operations: ride out an outage, then fail loudly.

A spot region blips, an S3 endpoint returns 503s, a NAT gateway restarts: the
store is briefly unreachable far more often than it is gone. Every store call
retries with jittered exponential backoff for up to a time budget
(`store.retry_budget_s` in the flow, 120 s by default) and then raises
`StoreUnavailable` naming the store — never swallowing a write.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception,
    stop_after_delay,
    wait_random_exponential,
)

from astraflow.stores.uri import redact

log = logging.getLogger("astraflow.stores")

T = TypeVar("T")

DEFAULT_BUDGET_S = 120.0


class StoreError(RuntimeError):
    """The store refused or failed an operation; the message names the store or table."""


class StoreUnavailable(StoreError):
    """The store stayed unreachable for the whole retry budget."""


def transient(exc: BaseException) -> bool:
    """Worth another try: anything from the storage layer, not our own refusals.

    FileNotFoundError is an answer, not an outage; ValueError/TypeError are
    caller bugs or validation refusals (SchemaMismatch is a ValueError), and so are
    AttributeError, NameError, AssertionError and ImportError: retrying a bug for the
    whole budget only hides it for two minutes behind "attempt N failed" lines.
    """
    if isinstance(exc, StoreUnavailable):
        return False
    return not isinstance(exc, FileNotFoundError | ValueError | TypeError | KeyError
                          | AttributeError | NameError | AssertionError | ImportError)


def call(fn: Callable[[], T], *, what: str, budget_s: float = DEFAULT_BUDGET_S,
         retry_if: Callable[[BaseException], bool] = transient,
         before_retry: Callable[[], None] | None = None, max_wait_s: float = 5.0) -> T:
    """Run `fn`, retrying transient failures for up to `budget_s` seconds.

    `before_retry` runs before each new attempt (e.g. to check whether an
    ambiguous write landed after all). Raises StoreUnavailable with `what`
    (which names the store) and the last error, redacted, once the budget is spent.
    """
    t0 = time.monotonic()
    try:
        for attempt in Retrying(
            retry=retry_if_exception(retry_if),
            stop=stop_after_delay(budget_s),
            wait=wait_random_exponential(multiplier=0.05, max=max_wait_s),
            before_sleep=lambda rs: log.warning(
                "%s: attempt %d failed after %.1fs, retrying: %s", what, rs.attempt_number,
                time.monotonic() - t0, redact(rs.outcome.exception())),
            reraise=False,
        ):
            with attempt:
                if attempt.retry_state.attempt_number > 1 and before_retry is not None:
                    before_retry()
                return fn()
    except RetryError as err:
        last = err.last_attempt.exception()
        raise StoreUnavailable(
            f"{what}: gave up after {time.monotonic() - t0:.0f}s "
            f"(store.retry_budget_s={budget_s:g}): {type(last).__name__}: {redact(last)}"
        ) from None
    raise AssertionError("unreachable")  # pragma: no cover
