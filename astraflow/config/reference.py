"""The flow file's reference, generated from the pydantic models themselves.

Why generated: a hand-written reference drifts the day a field is added. Every
field of a flow (astraflow.config.flow.FlowSpec and the section models of
astraflow.config) carries a docstring, which pydantic reads as the field's
description (`use_attribute_docstrings` in astraflow.config.spec); this module walks
the models and writes one Markdown table per section. `docs/flow.md` is its
output, and a test fails when that file is stale or a field has no description.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

HEADER = """# Flow file reference

Generated from the pydantic models (`astraflow flow-reference > docs/flow.md`); do not
edit by hand. A flow is a YAML file whose top level is `FlowSpec`. Unknown keys are
errors; every field below may be left out (it takes its default) unless its default
reads *required*. Override any field on the command line with `--set path=value`,
e.g. `--set rollout.workers=2 --set policies.0.algorithm.lr=5e-5`.
"""


def _models(annotation: Any) -> Iterator[type[BaseModel]]:
    """The pydantic models an annotation mentions (through list, dict, Optional …)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _models(arg)


def sections(root: type[BaseModel]) -> list[tuple[str, type[BaseModel]]]:
    """(path, model) for the root and every nested model, depth first, each once."""
    out: list[tuple[str, type[BaseModel]]] = []
    seen: set[type[BaseModel]] = set()

    def walk(path: str, model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        out.append((path, model))
        for name, field in model.model_fields.items():
            many = typing.get_origin(field.annotation) in (list, dict) or any(
                typing.get_origin(a) in (list, dict) for a in typing.get_args(field.annotation))
            for sub in _models(field.annotation):
                walk((f"{path}.{name}" if path else name) + ("[]" if many else ""), sub)

    walk("", root)
    return out


def _type(annotation: Any) -> str:
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    text = text.replace("typing.", "").replace("NoneType", "None")
    return re.sub(r"astraflow\.config\.\w+\.", "", text)


def _default(field: FieldInfo) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "*required*"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        return ", ".join(getattr(v, "name", type(v).__name__) for v in value)
    return f"`{value!r}`" if value not in ("", None) else f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def undocumented(root: type[BaseModel]) -> list[str]:
    """`Model.field` for every field without a description."""
    return [f"{m.__name__}.{n}" for _, m in sections(root)
            for n, f in m.model_fields.items() if not (f.description or "").strip()]


def flow_reference() -> str:
    from astraflow.config.flow import FlowSpec

    parts = [HEADER]
    for path, model in sections(FlowSpec):
        title = path or "top level"
        doc = inspect.cleandoc(model.__doc__ or "")
        parts.append(f"\n## `{title}` ({model.__name__})\n")
        if doc and not doc.startswith(("Usage docs", "A base class")):
            parts.append(_cell(doc) + "\n")
        parts.append("| field | type | default | meaning |\n|---|---|---|---|")
        for name, field in model.model_fields.items():
            parts.append(f"| `{name}` | {_cell(_type(field.annotation))} | "
                         f"{_cell(_default(field))} | {_cell(field.description or '')} |")
        parts.append("")
    return "\n".join(parts).rstrip() + "\n"
