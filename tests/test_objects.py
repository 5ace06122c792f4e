"""ObjectStore.sizes on a local store while files come and go."""

from __future__ import annotations

import os

import pytest

from astraflow.stores import objects
from astraflow.stores.objects import ObjectStore


@pytest.mark.parametrize("when", ["before_any_stat", "after_first_stat"])
def test_sizes_skips_a_file_removed_between_listing_and_stat(tmp_path, monkeypatch, when):
    """A staged file the listing saw is renamed away by its writer before (or right
    after) it is first stat'ed: sizes() leaves it out instead of raising. No race: the
    file is really removed, inside a patched os.stat, at a fixed point."""
    store = ObjectStore(tmp_path / "store")
    store.put_bytes("weights/v1/model.safetensors", b"x" * 10)
    staged = tmp_path / "store" / "weights" / "v1" / ".manifest.json.tmp"
    staged.write_bytes(b"{}")
    real_stat, seen = os.stat, []

    def stat(path, *a, **kw):
        if os.fspath(path) != os.fspath(staged):
            return real_stat(path, *a, **kw)
        seen.append(path)
        if when == "before_any_stat" and len(seen) == 1:
            staged.unlink()
        out = real_stat(path, *a, **kw)  # raises FileNotFoundError once it is gone
        if when == "after_first_stat" and len(seen) == 1:
            staged.unlink()
        return out

    monkeypatch.setattr(objects.os, "stat", stat)
    sizes = store.sizes("weights")
    assert seen, "the listing should have seen the staged file"
    assert sizes.pop("v1/model.safetensors") == 10
    assert sizes in ({}, {"v1/.manifest.json.tmp": 2})  # gone, or seen whole before it went
    monkeypatch.undo()
    assert store.walk("weights") == ["v1/model.safetensors"]
    assert store.sizes("nowhere") == {}
