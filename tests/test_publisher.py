"""The trainer's publisher writes a version from a thread in async mode: the weights it
writes are the ones handed over, whatever the trainer does next."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from astraflow.config.store import StoreSpec
from astraflow.models.factory import tiny_llama
from astraflow.stores import WeightStore
from astraflow.stores.mirror import Mirror
from astraflow.train.publisher import Publisher, frozen_state


def test_frozen_state_is_a_copy_that_keeps_tied_weights_tied():
    model = tiny_llama(hidden_size=32, layers=1, heads=2, intermediate_size=64, seed=0)
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as SmolLM2's are
    state = frozen_state(model)
    before = state["model.embed_tokens.weight"].clone()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # the trainer's next update
    assert torch.equal(state["model.embed_tokens.weight"], before)
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    assert state["model.norm.weight"].data_ptr() != model.model.norm.weight.data_ptr()


def _publisher(tmp_path: Path) -> tuple[WeightStore, Publisher]:
    ws = WeightStore(tmp_path / "weights")
    return ws, Publisher(ws, "p", StoreSpec(), Mirror(ws, [], "p", keep_last=3),
                         background=True)


def _writer(staging: Path, value: float, gate: threading.Event | None = None):
    def write() -> None:
        if gate is not None:
            assert gate.wait(30)
        from safetensors.torch import save_file
        save_file({"w": torch.full((4,), value)}, str(staging / "model.safetensors"))
        (staging / "config.json").write_text("{}")
    return write


def test_background_publish_writes_then_publishes_in_order(tmp_path):
    ws, pub = _publisher(tmp_path)
    gate = threading.Event()
    staging = ws.staging_dir("p")
    v0 = pub.publish(staging, step=0, parent=None, lineage=0, write=_writer(staging, 1.0, gate))
    assert v0 == 0 and ws.latest("p") is None  # handed over, not out: the write waits
    gate.set()
    staging = ws.staging_dir("p")
    v1 = pub.publish(staging, step=1, parent=0, lineage=1, write=_writer(staging, 2.0))
    pub.wait()
    assert (v0, v1) == (0, 1) and ws.versions("p") == [0, 1]
    got = [float(load_file(str(ws.load("p", v) / "model.safetensors"))["w"][0])
           for v in (0, 1)]
    assert got == [1.0, 2.0]


def test_a_failed_background_write_is_raised_by_the_next_call(tmp_path):
    ws, pub = _publisher(tmp_path)

    def broken() -> None:
        raise OSError("disk full")

    pub.publish(ws.staging_dir("p"), step=0, parent=None, lineage=0, write=broken)
    with pytest.raises(RuntimeError, match="publishing p failed") as e:
        pub.wait()
    assert isinstance(e.value.__cause__, OSError)
    assert ws.latest("p") is None
