"""The entropy floor in nats, where a flow sets it as a share of version 0's entropy.

`algorithm.entropy_floor_of_v0` asks for a floor under the sampling entropy that is a
share of where the policy started, because how sure a healthy policy is depends on
the task (astraflow.config.flow.HF_ENTROPY_FLOOR_OF_V0 says what was measured). Where
it started is read from the trajectory store, never carried in trainer state: the
first `rows` rows version 0 sampled, in commit order, are the same rows for the
trainer that read them first and for one resumed after a crash, so both bound the
same steps the same way.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from astraflow.config.algorithm import AlgorithmSpec
from astraflow.stores import TrajectoryStore
from astraflow.stores.schema import CREATED_AT_VERSION


def mean_surprisal(rows: pa.Table) -> float | None:
    """−mean behaviour logprob over the loss-masked (generated) tokens of `rows`: the
    mean surprisal of tokens drawn from a distribution estimates its entropy without
    bias. None when the rows hold no generated token."""
    logp = rows.column("behavior_logprobs").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    mask = rows.column("loss_mask").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    if len(logp) != len(mask):
        raise ValueError(f"behaviour logprobs ({len(logp)} tokens) and loss mask "
                         f"({len(mask)} tokens) differ in length")
    on = mask > 0
    if not on.any():
        return None
    return float(-np.asarray(logp, dtype=np.float64)[on].mean())


def version0_rows(traj: TrajectoryStore, policy: str, rows: int) -> pa.Table:
    """The first `rows` rows version 0 of `policy` sampled, in commit order (retired
    rows included: the store's archive keeps them), fewer while fewer exist."""
    t = traj.scan(policy, ["traj_id", "behavior_logprobs", "loss_mask"],
                  "behavior_version = 0")
    order = t.sort_by([(CREATED_AT_VERSION, "ascending"), ("traj_id", "ascending")])
    return order.slice(0, rows)


class EntropyFloor:
    """The floor each step's entropy hinge uses (astraflow.train.loss.entropy_floor_on),
    in nats per token: `entropy_floor` as given, or `entropy_floor_of_v0` × version 0's
    entropy once a whole batch of version 0's rows is in the store (until then the
    share of the rows there, so the first step has a floor too)."""

    def __init__(self, algo: AlgorithmSpec, traj: TrajectoryStore, policy: str, rows: int):
        self.algo, self.traj, self.policy, self.rows = algo, traj, policy, rows
        self._of_v0: float | None = None  # version 0's entropy, once read from a whole batch

    def nats(self) -> float | None:
        if self.algo.entropy_floor is not None or self.algo.entropy_floor_of_v0 is None:
            return self.algo.entropy_floor
        if self._of_v0 is None:
            got = version0_rows(self.traj, self.policy, self.rows)
            h0 = mean_surprisal(got) if got.num_rows else None
            if h0 is None:
                raise RuntimeError(
                    f"policy {self.policy!r} sets algorithm.entropy_floor_of_v0, but the store "
                    f"holds no generated token sampled by its version 0 to measure that from")
            if got.num_rows < self.rows:
                return self.algo.entropy_floor_of_v0 * h0
            self._of_v0 = h0
        return self.algo.entropy_floor_of_v0 * self._of_v0
