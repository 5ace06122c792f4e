"""Spot capacity traces: how many spot instances a zone would give, over time.

The format of the public traces (`skypilot-org/spot-traces`, the SpotHedge
artifact): `{"metadata": {"gap_seconds": G}, "data": [n0, n1, ...]}`, where
`data[i]` is the number of instances available (availability traces) or alive
(preemption traces) at `i * G` seconds. In the simulator a pool's spot workers
beyond the trace's value are preempted, and launches beyond it fail.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SpotTrace:
    name: str
    gap_s: float
    values: tuple[int, ...]
    scale: int = 1  # workers per trace unit (a trace of 8-GPU VMs, 1-GPU workers: 8)
    offset: int = 0  # start this many ticks into the trace

    def __post_init__(self) -> None:
        if self.gap_s <= 0 or not self.values:
            raise ValueError(f"trace {self.name}: need gap_s > 0 and at least one value")
        if any(v < 0 for v in self.values):
            raise ValueError(f"trace {self.name}: negative instance counts")

    def capacity(self, t: float) -> int:
        """Workers available at `t` seconds (the trace wraps around)."""
        i = (self.offset + int(t // self.gap_s)) % len(self.values)
        return self.values[i] * self.scale

    @property
    def hours(self) -> float:
        return len(self.values) * self.gap_s / 3600

    def changes(self, horizon_s: float) -> list[float]:
        """Times in [0, horizon_s) at which the capacity may change (every tick)."""
        n = int(horizon_s // self.gap_s) + 1
        return [k * self.gap_s for k in range(1, n)]

    def preemptions(self, horizon_s: float | None = None) -> int:
        """Instances lost (sum of drops) over the horizon (default: the whole trace)."""
        n = len(self.values) if horizon_s is None else int(horizon_s // self.gap_s) + 1
        vals = [self.capacity(k * self.gap_s) for k in range(n)]
        return sum(max(a - b, 0) for a, b in zip(vals, vals[1:], strict=False))

    def with_(self, *, scale: int | None = None, offset: int | None = None) -> SpotTrace:
        return SpotTrace(self.name, self.gap_s, self.values,
                         self.scale if scale is None else scale,
                         self.offset if offset is None else offset)


def load_trace(path: str | Path, *, scale: int = 1, offset: int = 0) -> SpotTrace:
    path = Path(path)
    d = json.loads(path.read_text())
    try:
        gap, data = float(d["metadata"]["gap_seconds"]), d["data"]
    except (KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a spot trace ({{'metadata': {{'gap_seconds'}}, 'data'}}): "
                         f"missing {err}") from None
    return SpotTrace(f"{path.parent.name}/{path.stem}", gap, tuple(int(v) for v in data),
                     scale, offset)
