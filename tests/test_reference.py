"""The flow reference is generated from the models: complete, and docs/flow.md current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from astraflow.config.flow import FlowSpec
from astraflow.config.reference import flow_reference, sections, undocumented

ROOT = Path(__file__).resolve().parent.parent


def test_every_field_is_described():
    assert undocumented(FlowSpec) == [], "give these fields a docstring (astraflow/config/)"


def test_every_section_and_field_is_in_the_reference():
    text = flow_reference()
    for path, model in sections(FlowSpec):
        assert f"`{path or 'top level'}` ({model.__name__})" in text
        for name in model.model_fields:
            assert f"| `{name}` |" in text


def test_docs_flow_md_is_current():
    out = subprocess.run([sys.executable, "-m", "astraflow", "flow-reference"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    committed = (ROOT / "docs" / "flow.md").read_text()
    assert out == committed, "docs/flow.md is stale: run `astraflow flow-reference > docs/flow.md`"


def test_a_field_without_docstring_is_caught():
    from pydantic import BaseModel

    from astraflow.config.spec import Spec

    class Child(Spec):
        documented: int = 1
        """Has one."""
        bare: int = 2

    class Root(Spec):
        child: Child = Child()
        """The child."""

    assert undocumented(Root) == ["Child.bare"]
    assert issubclass(Root, BaseModel)

