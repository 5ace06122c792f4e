"""The trajectory row contract, versioned and checked on every write.

A row is one policy's part of one episode. Writers build rows as dicts or
Arrow tables; `validate` refuses anything that does not match, naming the
column, so a bad writer fails loudly at the source instead of poisoning a
trainer later.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from astraflow.stores.retry import StoreError

SCHEMA_VERSION = 1
#: Row-creation version column Lance maintains when stable row ids are on: the table
#: version that committed each row, which every cursor of the store counts in.
CREATED_AT_VERSION = "_row_created_at_version"


class SchemaMismatch(StoreError, ValueError):
    """A batch does not match the table's contract; the message names the column."""


TRAJECTORY_SCHEMA = pa.schema(
    [
        pa.field("traj_id", pa.string(), nullable=False),
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("policy", pa.string(), nullable=False),
        pa.field("behavior_version", pa.int64(), nullable=False),
        pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("completion_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("behavior_logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("loss_mask", pa.list_(pa.int8()), nullable=False),
        pa.field("reward", pa.float32(), nullable=False),
        pa.field("env", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("worker", pa.string(), nullable=False),
        pa.field("region", pa.string(), nullable=False),
        pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("extras", pa.string(), nullable=False),
    ],
    metadata={"astraflow.schema_version": str(SCHEMA_VERSION)},
)

#: Per-token list columns that must all be as long as `completion_ids`.
TOKEN_ALIGNED = ("behavior_logprobs", "loss_mask")


def to_table(rows: list[dict[str, Any]] | pa.Table) -> pa.Table:
    """Build a validated Arrow table from row dicts (or validate a table)."""
    if isinstance(rows, pa.Table):
        return validate(rows)
    if not rows:
        raise SchemaMismatch("empty batch: a commit must carry at least one row")
    names = TRAJECTORY_SCHEMA.names
    for i, row in enumerate(rows):
        missing = [n for n in names if n not in row]
        extra = [k for k in row if k not in names]
        if missing or extra:
            raise SchemaMismatch(
                f"row {i}: missing columns {missing} / unknown columns {extra}; "
                f"a trajectory row has exactly {names}"
            )
    cols = {}
    for field in TRAJECTORY_SCHEMA:
        values = [r[field.name] for r in rows]
        try:
            cols[field.name] = pa.array(values, type=field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as err:
            raise SchemaMismatch(
                f"column {field.name!r}: values do not fit {field.type}: {err}"
            ) from err
    return validate(pa.table(cols, schema=TRAJECTORY_SCHEMA))


def validate(table: pa.Table) -> pa.Table:
    """Check a batch against the contract; return it cast to the exact schema."""
    expected = {f.name: f for f in TRAJECTORY_SCHEMA}
    got = {f.name: f for f in table.schema}
    for name in expected:
        if name not in got:
            raise SchemaMismatch(f"column {name!r} is missing (expected {expected[name].type})")
    for name, field in got.items():
        if name not in expected:
            raise SchemaMismatch(f"column {name!r} is not part of trajectory schema v{SCHEMA_VERSION}")
        if not field.type.equals(expected[name].type):
            raise SchemaMismatch(
                f"column {name!r} has type {field.type}, expected {expected[name].type}"
            )
    table = table.select(TRAJECTORY_SCHEMA.names)
    for name in TRAJECTORY_SCHEMA.names:
        if table.column(name).null_count:
            raise SchemaMismatch(f"column {name!r} has nulls; every field is required")
    n_completion = pc.list_value_length(table.column("completion_ids"))
    for name in TOKEN_ALIGNED:
        n = pc.list_value_length(table.column(name))
        if not pc.all(pc.equal(n, n_completion)).as_py():
            raise SchemaMismatch(
                f"column {name!r} must have one entry per completion token "
                f"(same length as 'completion_ids')"
            )
    return table.cast(TRAJECTORY_SCHEMA)
