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
from astraflow.stores import Ledger, TrajectoryStore, WeightStore

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

    @property
    def weights_root(self) -> Path:
        return Path(self.flow.store.weights or self.run_dir / "weights")

    def trajectories(self) -> TrajectoryStore:
        return TrajectoryStore(self.store_uri)

    def weights(self) -> WeightStore:
        return WeightStore(self.weights_root)

    def ledger(self) -> Ledger:
        return Ledger(self.store_uri)


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
