"""One evaluator for both sides: AstraFlow's own held-out scoring (the flow's codec,
chat-template prompts, stop tokens, reward; greedy) on one engine of its own, fed the
weights to judge either as an AstraFlow version folder or as a TRL model's state dict.
Both sides are scored by the same code, on the same held-out questions, in fp32."""

from __future__ import annotations

from pathlib import Path

import torch

from astraflow.config.flow import FlowSpec
from astraflow.rollout.engine import HFEngine
from astraflow.workflows.workload import make_workflow


class SharedEvaluator:
    def __init__(self, flow: FlowSpec, n: int):
        pol = flow.policy
        self.engine = HFEngine.from_dir(Path(pol.model.path), dtype="float32")
        self.workflow = make_workflow(flow, self.engine.codec)
        self.role = flow.role_of(pol.name)
        self.items = self.workflow.eval_items(self.role, n)

    def _score(self) -> float:
        self.engine.model.eval()
        return self.workflow.score(self.role, self.engine, self.items)

    def folder(self, path: Path) -> float:
        """Accuracy of the weights in a version folder (an AstraFlow version)."""
        self.engine.load_weights(path)
        return self._score()

    @torch.no_grad()
    def model(self, model: torch.nn.Module) -> float:
        """Accuracy of a live model's weights (TRL's, after a step), copied in."""
        self.engine.model.load_state_dict(model.state_dict())
        return self._score()
