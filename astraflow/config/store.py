"""Where a run's data lives (`store:`): trajectories, ledger, weights, checkpoints, weight
replicas. Locations are local paths or s3:// URIs, never with credentials in them."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlparse

from pydantic import Field, field_validator

from astraflow.config.spec import Spec, unique


def check_location(v: str | None) -> str | None:
    """A local path or s3://bucket/prefix, with no credentials in it."""
    if v is None or "://" not in v or v.startswith("file://"):
        return v
    parsed = urlparse(v)
    if parsed.scheme != "s3":
        raise ValueError(f"scheme {parsed.scheme!r} is not supported: use a local path or "
                         f"s3://bucket/prefix (GCS and others through AWS_ENDPOINT_URL)")
    if "@" in parsed.netloc or parsed.password or parsed.query:
        raise ValueError("credentials do not belong in a store URI: set AWS_ACCESS_KEY_ID / "
                         "AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL) in the environment")
    if not parsed.netloc:
        raise ValueError(f"{v!r} names no bucket (expected s3://bucket/prefix)")
    return v.rstrip("/")


class ReplicaSpec(Spec):
    """A copy of the weight store near a group of rollout workers (another bucket,
    region, endpoint or cloud). Trainers mirror each published version into it,
    manifest last; workers started with `--region <region>` read from it."""

    region: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """The name workers give with `--region` (or ASTRAFLOW_REGION), e.g. eu-west-1."""
    weights: str
    """The replica's weight root: s3://bucket/prefix (or a local path, for tests)."""
    endpoint: str | None = None
    """Its S3 endpoint when it is not the one in AWS_ENDPOINT_URL (R2, MinIO, GCS
    interop, another cloud). Not secret; keys never go here."""
    credentials_env: str | None = Field(None, pattern=r"^[A-Z][A-Z0-9_]*$")
    """Read this replica's keys from `<credentials_env>AWS_ACCESS_KEY_ID` etc.
    (e.g. `EU_`); default: the same AWS_* variables as the main store."""

    @field_validator("weights")
    @classmethod
    def _location(cls, v: str) -> str:
        return check_location(v) or v

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parsed = urlparse(v)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError("endpoint must be an http(s):// URL")
        if "@" in parsed.netloc or parsed.query:
            raise ValueError("credentials do not belong in an endpoint: use credentials_env")
        return v.rstrip("/")


class StoreSpec(Spec):
    uri: str | None = None
    """Trajectory/ledger/metrics location, a path or s3://bucket/prefix; default
    `runs/<name>/store`. Credentials and endpoint come from the environment only."""
    weights: str | None = None
    """Weight store root; default `<uri>/weights`, or `runs/<name>/weights`."""
    checkpoints: str | None = None
    """Trainer checkpoints; default `<uri>/checkpoints`, or `runs/<name>/checkpoints`."""
    retry_budget_s: float = Field(120.0, gt=0)
    """How long components retry an unreachable store before stopping with an error."""
    write_mode: Literal["auto", "staged", "direct"] | None = None
    """How rollout writers append trajectory batches. Unset: `staged` when the store is
    an object store (`s3://`), `auto` on a local path (`RunContext.write_mode`).
    `auto`: a writer commits its own batch and, when it loses the manifest race to
    another writer, leaves it staged for the trainer to commit in its next read
    (`stores.staging`). `staged`: no writer commits; every batch is staged (data files
    and a small marker) and the trainer commits them all in one `Append` when it reads:
    no manifest race at all, and on S3 two sequential requests per append instead of
    four (S3 behind 20 ms per request, long rows: one writer 0.62x plain Parquet files
    against `auto`'s 0.31x; 64 writers 5.0x one writer at p99 append 1.6 s, where
    `auto`'s own commits starve the trainer's commit of the batches they staged; README
    "The trajectory store at scale"). Its cost: rows show in `status`, `inspect` and
    the dashboard only once the trainer has read them (not while it is down).
    `direct`: one `table.add` per batch, retried through conflicts (the old path;
    every writer races for the manifest)."""

    retire_consumed: bool = True
    """Maintenance moves trajectory rows every trainer restart point has passed (the
    oldest checkpoint's cursor) from `traj_<policy>` to `retired_<policy>`. Lance keeps
    each row's creating commit in the table's manifest, so without this every commit
    costs more the longer the run (a 100,000-commit soak: manifests of 2.5 MB by the
    end, read-next-batch p50 138 -> 446 ms). Audits, replays, `inspect` and the dashboard read both tables."""

    metrics_every_s: float = Field(1.0, ge=0)
    """Trainers and rollout workers commit their metrics rows at most once per this
    many seconds (and when they idle or stop), not once per step: fewer, larger
    fragments for the dashboard and sinks to read. 0 commits every step; a SIGKILL
    loses at most this long of metrics (never trajectories or ledger rows)."""

    replicas: list[ReplicaSpec] = Field(default_factory=list)
    """Weight replicas near rollout pools in other regions or clouds (see ReplicaSpec)."""

    @field_validator("uri", "weights", "checkpoints")
    @classmethod
    def _location(cls, v: str | None) -> str | None:
        return check_location(v)

    @field_validator("replicas")
    @classmethod
    def _unique_regions(cls, v: list[ReplicaSpec]) -> list[ReplicaSpec]:
        unique([r.region for r in v], "two replicas name the same region")
        return v
    keep_last: int = Field(4, ge=1)
    """Newest weight versions kept per policy (version 0 is always kept)."""
    keep_every: int = Field(25, ge=0)
    """Also keep every N-th version (milestones for accuracy curves); 0 = none."""
    delta_chain: int = Field(0, ge=0)
    """Publish a full-weight version as a delta against its parent (each weight file
    XOR its parent's, zstd-compressed; docs/weights.md), with a whole snapshot after
    this many deltas in a row. Workers then fetch only the deltas after the version
    they hold, and replicas copy deltas. 0: every version whole. Pruning keeps every
    version a kept delta is rebuilt from, so disk holds up to this many more."""
