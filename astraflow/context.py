"""Where a run lives and how components open its stores.

Every component (launcher, rollout worker, trainer, evaluator) is started with
only a run target; it reads `flow.resolved.yaml` from there and opens the same
stores. That is the whole coupling between components. The target is either

    a run folder   runs/<name>/ on this machine (the embedded default), or
    a store URI    s3://bucket/prefix holding flow.resolved.yaml, put there by
                   `astraflow launch` (`publish_flow`): how cloud components that
                   share nothing but the bucket find the run. Their logs go to
                   a local runs/<name>/ folder.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from astraflow.config.flow import FlowSpec
from astraflow.config.loader import FlowError, load_flow, parse_flow
from astraflow.config.store import ReplicaSpec
from astraflow.stores import CheckpointStore, Ledger, ObjectStore, TrajectoryStore, WeightStore
from astraflow.stores.trajectories import WriteMode
from astraflow.stores.uri import S3Settings, is_remote, redact

RESOLVED = "flow.resolved.yaml"


def publish_flow(flow: FlowSpec, *, overwrite: bool = False) -> str:
    """Write the resolved flow into its (remote) store so cloud components can open
    the run by the store URI alone; returns that URI.

    Like `prepare_run`, a different flow already published there is refused
    unless `overwrite`: two flows sharing one store would corrupt each other.
    """
    if not flow.store.uri or not is_remote(flow.store.uri):
        raise FlowError("a cloud run needs a shared store: set store.uri to s3://bucket/prefix")
    objects = ObjectStore(flow.store.uri, retry_budget_s=flow.store.retry_budget_s)
    text = flow.dump()
    try:
        there = objects.get_bytes(RESOLVED).decode()
    except FileNotFoundError:
        there = None
    if there is not None and there != text and not overwrite:
        raise FlowError(f"{flow.store.uri} holds a run of a different flow; pass --overwrite "
                        f"to replace it or choose another store.uri")
    if there != text:
        objects.put_bytes(RESOLVED, text.encode())
    return flow.store.uri


@dataclass
class RunContext:
    flow: FlowSpec
    run_dir: Path

    @classmethod
    def open(cls, target: str | Path, *, runs_root: str | Path = "runs") -> RunContext:
        """Open a run from its folder or from the store URI `publish_flow` wrote to."""
        if not is_remote(target):
            run_dir = Path(target)
            return cls(load_flow(run_dir / RESOLVED), run_dir)
        uri = str(target).rstrip("/")
        try:
            text = ObjectStore(uri).get_bytes(RESOLVED).decode()
        except FileNotFoundError:
            raise FlowError(f"{uri} holds no {RESOLVED}: publish the run with "
                            f"`astraflow launch FLOW` first") from None
        flow = parse_flow(yaml.safe_load(text), f"{redact(uri)}/{RESOLVED}")
        if (flow.store.uri or "").rstrip("/") != uri:
            raise FlowError(f"{uri}/{RESOLVED} names another store ({flow.store.uri}); "
                            f"open the run by its store.uri")
        run_dir = Path(runs_root) / flow.name
        run_dir.mkdir(parents=True, exist_ok=True)
        return cls(flow, run_dir)

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

    @property
    def write_mode(self) -> WriteMode:
        """The flow's `store.write_mode`, or where it is unset: `staged` on an object
        store, `auto` on a local path. On S3 a lone `auto` writer's own commit is four
        sequential requests against a staged append's two, and under many writers their
        own commits keep winning the manifest race against the trainer's commit of the
        batches they staged, so those wait (README "The trajectory store at scale")."""
        if self.flow.store.write_mode is not None:
            return self.flow.store.write_mode
        return "staged" if is_remote(self.store_uri) else "auto"

    def trajectories(self) -> TrajectoryStore:
        return TrajectoryStore(self.store_uri, retry_budget_s=self._budget,
                               write_mode=self.write_mode)

    def weights(self, region: str | None = None) -> WeightStore:
        """The weight store; with `region`, the replica for that region if the flow
        has one (rollout workers read near them), else the main store."""
        replica = self.replica(region) if region else None
        if replica is None:
            return WeightStore(self.weights_root, retry_budget_s=self._budget)
        return replica_store(replica, self._budget)

    def replica(self, region: str) -> ReplicaSpec | None:
        return next((r for r in self.flow.store.replicas if r.region == region), None)

    def replicas(self) -> list[tuple[str, WeightStore]]:
        """Every weight replica by region (what the trainer mirrors into)."""
        return [(r.region, replica_store(r, self._budget)) for r in self.flow.store.replicas]

    def checkpoints(self) -> CheckpointStore:
        return CheckpointStore(self.checkpoints_root, retry_budget_s=self._budget)

    def ledger(self) -> Ledger:
        return Ledger(self.store_uri, retry_budget_s=self._budget)


def replica_store(replica: ReplicaSpec, retry_budget_s: float) -> WeightStore:
    settings = (S3Settings.from_env(replica.credentials_env or "", endpoint=replica.endpoint)
                if is_remote(replica.weights) else None)
    return WeightStore(replica.weights, retry_budget_s=retry_budget_s, settings=settings)


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
