"""Reading a flow: YAML in, a validated FlowSpec out, with `--set` overrides applied and
every problem reported by field path with a hint (the closest known field, what to add)."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from astraflow.config.flow import FlowSpec


class FlowError(ValueError):
    """A flow file is missing, unreadable or invalid; the message says how to fix it."""


def format_errors(err: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid flow ({err.error_count()} problem(s)):"]
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            field = str(e["loc"][-1])
            known = known_fields(e["loc"][:-1])
            close = difflib.get_close_matches(field, known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known fields: {', '.join(known)}"
            msg = f"unknown field — {hint}"
        elif e["type"] == "missing":
            msg = "required field is missing — add it"
        elif e["loc"][:1] == ("store",) or not e["loc"]:
            pass  # never echo a store location (or the whole flow) back: it may carry a credential
        else:
            msg = f"{msg} (got {e.get('input')!r})"
        lines.append(f"  {path}: {msg}")
    return "\n".join(lines)


def known_fields(loc: tuple[Any, ...]) -> list[str]:
    model: Any = FlowSpec
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        ann = field.annotation
        args = getattr(ann, "__args__", None)
        if args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
            ann = args[0]
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return sorted(model.model_fields)


def parse_flow(data: Any, source: str = "<flow>") -> FlowSpec:
    if not isinstance(data, dict):
        raise FlowError(f"{source}: a flow is a YAML mapping (name:, policies:, …), got {type(data).__name__}")
    try:
        return FlowSpec.model_validate(data)
    except ValidationError as err:
        raise FlowError(format_errors(err, source)) from None


def load_flow(path: str | Path, overrides: dict[str, Any] | None = None) -> FlowSpec:
    """Read and validate a flow YAML; `overrides` are dotted keys (`stop.max_steps`)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise FlowError(f"{path}: no such flow file") from None
    except yaml.YAMLError as err:
        raise FlowError(f"{path}: not valid YAML: {err}") from None
    for key, value in (overrides or {}).items():
        set_dotted(data, key, value)
    return parse_flow(data, str(path))


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for p in parts[:-1]:
        if isinstance(node, list):
            node = node[int(p)]
        else:
            node = node.setdefault(p, {})
    if isinstance(node, list):
        node[int(parts[-1])] = value
    else:
        node[parts[-1]] = value
