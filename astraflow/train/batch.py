"""One optimizer step's rows as tensors: what the trainer's stages hand the step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass
class Batch:
    """One optimizer step's rows: token ids, and per completion token (flattened
    row by row) the behaviour logprob, loss mask and the row's advantage.
    `on_policy_rows`: rows sampled by exactly the weights the trainer holds
    (for the engine-vs-trainer mismatch), or None when no row is. `weights`: per
    token, its row's loss weight (None: all 1, the plain token mean). `solved_share`:
    the share of the step's consumed groups the policy already solves, read before the
    stages drop them (astraflow.train.trust.update_budget scales the bound by it)."""

    prompts: list[list[int]]
    completions: list[list[int]]
    behavior_logprobs: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    on_policy_rows: list[bool] | None = None
    weights: torch.Tensor | None = None
    solved_share: float = 0.0

    def __post_init__(self) -> None:
        n = sum(len(c) for c in self.completions)
        if self.weights is not None and self.weights.numel() != n:
            raise ValueError(f"Batch: {n} completion tokens but {self.weights.numel()} weights")
        if not (self.behavior_logprobs.numel() == self.mask.numel() == self.advantages.numel() == n):
            raise ValueError(f"Batch: {n} completion tokens but {self.behavior_logprobs.numel()} "
                             f"behaviour logprobs, {self.mask.numel()} mask entries, "
                             f"{self.advantages.numel()} advantages")

    @classmethod
    def from_rows(cls, prompts: list[list[int]], completions: list[list[int]],
                  behavior_logprobs: list[list[float]], loss_mask: list[list[int]],
                  advantages: list[float], on_policy_rows: list[bool] | None = None,
                  loss_weight: list[float] | None = None) -> Batch:
        weights = None if loss_weight is None else torch.tensor(
            [w for w, c in zip(loss_weight, completions, strict=True) for _ in c], dtype=torch.float32)
        return cls(
            prompts, completions,
            torch.tensor([x for r in behavior_logprobs for x in r], dtype=torch.float32),
            torch.tensor([x for r in loss_mask for x in r], dtype=torch.float32),
            torch.tensor([a for a, c in zip(advantages, completions, strict=True) for _ in c],
                         dtype=torch.float32),
            on_policy_rows, weights)

    @classmethod
    def from_table(cls, rows: pa.Table, on_policy_rows: list[bool] | None = None) -> Batch:
        """The staged trajectory rows' columns (with `loss_weight` when a stage wrote it)."""
        return cls.from_rows(
            rows.column("prompt_ids").to_pylist(), rows.column("completion_ids").to_pylist(),
            rows.column("behavior_logprobs").to_pylist(), rows.column("loss_mask").to_pylist(),
            rows.column("advantage").to_pylist(), on_policy_rows,
            rows.column("loss_weight").to_pylist() if "loss_weight" in rows.column_names else None)

    def __len__(self) -> int:
        return len(self.prompts)

    def offsets(self) -> list[int]:
        out = [0]
        for c in self.completions:
            out.append(out[-1] + len(c))
        return out

    def select(self, start: int, stop: int) -> Batch:
        """Rows start..stop-1."""
        off = self.offsets()
        a, b = off[start], off[stop]
        return Batch(self.prompts[start:stop], self.completions[start:stop],
                     self.behavior_logprobs[a:b], self.mask[a:b], self.advantages[a:b],
                     None if self.on_policy_rows is None else self.on_policy_rows[start:stop],
                     None if self.weights is None else self.weights[a:b], self.solved_share)

    def token_rows(self, flags: Sequence[bool]) -> torch.Tensor:
        """A per-token bool mask from a per-row flag (on the batch's device)."""
        return torch.tensor([f for f, c in zip(flags, self.completions, strict=True) for _ in c],
                            dtype=torch.bool, device=self.mask.device)

    def to(self, device: torch.device) -> Batch:
        """The per-token tensors on `device` (the token ids stay lists until padded)."""
        if self.mask.device == device:
            return self
        return Batch(self.prompts, self.completions, self.behavior_logprobs.to(device),
                     self.mask.to(device), self.advantages.to(device), self.on_policy_rows,
                     None if self.weights is None else self.weights.to(device), self.solved_share)

