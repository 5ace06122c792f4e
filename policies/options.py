"""A scaling policy's options from a YAML file or an inline YAML mapping.

`astraflow scale --policy-config` and `benchmarks/scaling.py --policy-config` read
the options here; the policy's own typed config (e.g. `CostConfig`) then checks them,
so a wrong name or value is refused with what it means and how to fix it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError


def read_options(spec: str | Path | None) -> dict[str, Any]:
    """`spec` is a YAML file (`cost.yaml`) or an inline mapping (`'{wait_budget: 0.02}'`);
    None or empty: no options. Raises ValueError saying which and why."""
    if spec is None or not str(spec).strip():
        return {}
    text = str(spec)
    path = Path(text).expanduser()
    inline = text.lstrip().startswith(("{", "[")) or ("\n" in text) or (":" in text and not path.exists())
    if not inline:
        try:
            text = path.read_text()
        except OSError as err:
            raise ValueError(f"policy config {spec}: cannot read it ({err.strerror}); give a "
                             f"YAML file or an inline mapping such as '{{wait_budget: 0.02}}'"
                             ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"policy config {spec}: not valid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ValueError(f"policy config {spec}: expected a mapping of option: value (e.g. "
                         f"'{{wait_budget: 0.02}}'), got {type(data).__name__}")
    return data


def explain(err: ValidationError, what: str) -> str:
    """A validation error as one line per problem: `option: what is wrong, how to fix`."""
    lines = []
    for e in err.errors():
        where = ".".join(str(x) for x in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {msg}" if where and not msg.startswith(where) else msg)
    return f"{what} policy config: " + "; ".join(lines)

