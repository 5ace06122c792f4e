"""The cost policy's settings: one typed config, each field documented and checked.

`CostConfig` is what `CostAware(**options)`, `astraflow scale --policy-config` and the
benchmark build; an option it does not know, or a value out of range, is refused with
what the option means and how to fix it. Knobs removed by issue 33 are named in the
error with what replaced them (docs/benchmarks/scaling.md has the measurements).
"""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from astraflow.policies.options import explain

#: Knobs of the cost policy before issue 33, and what replaced each.
REMOVED = {
    "tier_share": "the cheap tier is gone: every spot pool's share follows from `wait_budget`",
    "tier_gap": "the cheap tier is gone: every spot pool's share follows from `wait_budget`",
    "tier_quiet_s": "derived: a pool passes `max_pool_share` once its time since the last "
                    "preemption nears lead time / `wait_budget`",
    "share_doubling_s": "derived: a pool's share grows with its time since the last "
                        "preemption, bounded by `wait_budget`",
    "max_share_quiet": "derived: a quiet pool may supply up to all of the demand, as "
                       "`wait_budget` allows",
    "share_clock": "fixed: the share's clock is the time since the pool's last preemption "
                   "(a refused launch does not put running workers at risk)",
    "probe_refused": "always on where the backend reports `quiet_s` (a refused probe costs "
                     "nothing)",
}


class CostConfig(BaseModel):
    """Every setting of the `cost` scaling policy (defaults: the benchmarked ones)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    headroom: float = 0.0
    """Extra share of the measured demand to supply (0: exactly the demand)."""
    drain_s: float = 600.0
    """A backlog below `backlog_target` is refilled over this many seconds."""
    backlog_target: float = 0.5
    """Share of the backpressure bound a growing fleet refills the backlog to."""
    backlog_high: float = 0.75
    """Share of the bound past which one worker below the demand is enough (more blocks)."""
    ondemand_floor: float = 0.0
    """Share of the demand always supplied on demand (0.5 while the deadline is at risk)."""
    deadline_margin: float = 0.9
    """The deadline is at risk when the rows left would need more than this share of it."""
    bootstrap: int = 2
    """Before the trainers' first step: that many of the cheapest pool's workers' rows/s,
    placed over the pools as a measured demand would be."""
    preemption_loss_s: float | None = None
    """Seconds of a worker one preemption costs (None: the pool's cold start + 60 s)."""
    gpu_ref: Literal["ondemand", "fewest", "none"] = "ondemand"
    """Whose GPU-hours per row bound the pools used: the on-demand pool cheapest per row,
    the fastest pool per GPU, or none (dollars alone)."""
    gpu_slack: float = 0.0
    """A pool may take (1 + gpu_slack) x the reference's GPU-hours per row."""
    max_pool_share: float = 1 / 3
    """Most of the demand one spot pool supplies with no record (just preempted, or the
    run just began): losing it leaves the rest fed while replacements start."""
    wait_budget: float = 0.025
    """Trainer wait (share of its time) the spot hedge may cost: a spot pool may supply
    more than `max_pool_share` once losing it at once, at the rate its time since the last
    preemption bounds, costs the trainers at most this share of their time. Default: half
    the 5% wait aim, the rest left for the ramp, growth lag and demand changes."""
    grow_margin: float = 1.0
    """Grow when the backlog would fall under this many trainer steps within a launch's
    lead time (0: only when it would run dry)."""

    @model_validator(mode="before")
    @classmethod
    def _known_options(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError(f"cost policy options must be a mapping of option: value, got "
                             f"{type(data).__name__}")
        known = list(cls.model_fields)
        for key in data:
            if key in REMOVED:
                raise ValueError(f"cost policy option {key!r} was removed (issue 33): "
                                 f"{REMOVED[key]}; drop it from the options")
            if key not in cls.model_fields:
                near = difflib.get_close_matches(str(key), known, n=1)
                raise ValueError(f"unknown cost policy option {key!r}"
                                 + (f" (did you mean {near[0]!r}?)" if near else "")
                                 + f"; known: {', '.join(known)}")
        return data

    @field_validator("bootstrap", mode="before")
    @classmethod
    def _whole(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int | float) or v != int(v) or v < 1:
            raise ValueError(f"bootstrap must be a whole number of workers >= 1, got {v!r} "
                             f"(e.g. bootstrap: 2)")
        return int(v)

    @field_validator("max_pool_share", "backlog_target", "backlog_high", "ondemand_floor",
                     "deadline_margin", "wait_budget")
    @classmethod
    def _share(cls, v: float, info: ValidationInfo) -> float:
        lo_open = info.field_name in ("max_pool_share", "backlog_high", "deadline_margin",
                                      "wait_budget")
        if not ((0 < v if lo_open else 0 <= v) and v <= 1):
            raise ValueError(f"{info.field_name} is a share: it must be in "
                             f"{'(0' if lo_open else '[0'}, 1], got {v!r} (e.g. "
                             f"{cls.model_fields[info.field_name].default:.3g})")
        return v

    @field_validator("headroom", "gpu_slack", "grow_margin", "preemption_loss_s")
    @classmethod
    def _non_negative(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is not None and not v >= 0:
            raise ValueError(f"{info.field_name} must be >= 0, got {v!r} (default "
                             f"{cls.model_fields[info.field_name].default})")
        return v

    @field_validator("drain_s")
    @classmethod
    def _positive(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(f"drain_s must be > 0 seconds, got {v!r} (default 600)")
        return v


def make_config(options: dict[str, Any]) -> CostConfig:
    """`CostConfig(**options)`, its errors as one ValueError that `explain`s them."""
    try:
        return CostConfig(**options)
    except ValidationError as err:
        raise ValueError(explain(err, "cost")) from None
