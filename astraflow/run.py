"""Where a run lives and how components open its stores.

Every component (launcher, rollout worker, trainer, evaluator) is started with
only a run directory; it reads `flow.resolved.yaml` from there and opens the
same stores. That is the whole coupling between components.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from astraflow.flow import FlowSpec, load_flow
from astraflow.stores import CheckpointStore, Ledger, TrajectoryStore, WeightStore

RESOLVED = "flow.resolved.yaml"


@dataclass
class RunContext:
    flow: FlowSpec
    run_dir: Path

    @classmethod
    def open(cls, run_dir: str | Path) -> RunContext:
        run_dir = Path(run_dir)
        return cls(load_flow(run_dir / RESOLVED), run_dir)

    @property
    def store_uri(self) -> str:
        return self.flow.store.uri or str(self.run_dir / "store")

    def _beside_store(self, explicit: str | None, name: str) -> str:
        if explicit:
            return explicit
        return f"{self.flow.store.uri}/{name}" if self.flow.store.uri else str(self.run_dir / name)

    @property
    def weights_root(self) -> str:
        """Weight store root: a local path or an s3:// URI."""
        return self._beside_store(self.flow.store.weights, "weights")

    @property
    def checkpoints_root(self) -> str:
        return self._beside_store(self.flow.store.checkpoints, "checkpoints")

    @property
    def _budget(self) -> float:
        return self.flow.store.retry_budget_s

    def trajectories(self) -> TrajectoryStore:
        return TrajectoryStore(self.store_uri, retry_budget_s=self._budget)

    def weights(self) -> WeightStore:
        return WeightStore(self.weights_root, retry_budget_s=self._budget)

    def checkpoints(self) -> CheckpointStore:
        return CheckpointStore(self.checkpoints_root, retry_budget_s=self._budget)

    def ledger(self) -> Ledger:
        return Ledger(self.store_uri, retry_budget_s=self._budget)


def quiet_libraries() -> None:
    """Silence progress bars and info chatter from transformers in components."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def setup_logging(component: str) -> logging.Logger:
    logging.basicConfig(
        level=os.environ.get("ASTRAFLOW_LOG", "INFO"),
        format=f"%(asctime)s {component} %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    return logging.getLogger(f"astraflow.{component}")
