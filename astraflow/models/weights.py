"""A version's safetensors files, and the in-place weight swap engines make on a new version."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def weight_files(path: str | Path) -> list[Path]:
    """The safetensors files of a version: the shards its index names, or the one file."""
    path = Path(path)
    if (path / INDEX).is_file():
        shards = sorted(set(json.loads((path / INDEX).read_text())["weight_map"].values()))
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise FileNotFoundError(f"{path / INDEX} names shards that are absent: {missing}")
        return [path / s for s in shards]
    if (path / SINGLE).is_file():
        return [path / SINGLE]
    raise FileNotFoundError(f"no weights in {path}: neither {SINGLE} nor {INDEX}")


@torch.no_grad()
def load_weights_into(model: torch.nn.Module, path: str | Path) -> None:
    """Swap weights in place from a verified version folder (no model rebuild), one
    tensor at a time, so peak extra memory is one tensor, not a second model.

    Every parameter and buffer the model saves must be in the files, except those
    tied to one that is (the LM head of a tied-embedding model, saved once); a
    name, shape or extra tensor that does not fit raises, naming them all.
    """
    params = model.state_dict(keep_vars=True)
    seen: set[str] = set()
    unexpected: list[str] = []
    wrong_shape: list[str] = []
    for f in weight_files(path):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                if name not in params:
                    unexpected.append(name)
                    continue
                target = params[name]
                tensor = st.get_tensor(name)
                if tuple(tensor.shape) != tuple(target.shape):
                    wrong_shape.append(f"{name} {tuple(tensor.shape)} vs {tuple(target.shape)}")
                    continue
                target.copy_(tensor)
                seen.add(name)
    loaded = {params[n].data_ptr() for n in seen}
    missing = [n for n in params if n not in seen and params[n].data_ptr() not in loaded]
    if unexpected or missing or wrong_shape:
        raise RuntimeError(f"weights at {path} do not fit the model: missing {missing}, "
                           f"unexpected {unexpected}, wrong shape {wrong_shape}")

