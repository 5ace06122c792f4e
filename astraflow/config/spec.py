"""What every model of a flow file shares (every module of astraflow.config)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict


class Spec(BaseModel):
    """Unknown keys are errors (a typo must not silently become a default), and
    defaults are validated like given values."""

    model_config = ConfigDict(extra="forbid", validate_default=True, use_attribute_docstrings=True)


def unique(names: Sequence[str], message: str) -> None:
    """Raise `message` (with the names) when a name appears twice."""
    if len(set(names)) != len(names):
        raise ValueError(f"{message}, got {list(names)}")
