"""Turn a trainer's state into checkpoint files and back — tensors as safetensors, the rest JSON.

Why not `torch.save`: a checkpoint may come back from a shared bucket, and
unpickling runs code. Model and optimizer tensors go into one safetensors
file under `model/…`, `optim/<param>/<key>` and `rng/torch` keys; everything
else (step, cursor, param groups, Python and NumPy RNG) is plain JSON.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

TENSORS = "state.safetensors"


def capture(model: torch.nn.Module, opt: torch.optim.Optimizer,
            counters: dict[str, Any]) -> tuple[dict[str, bytes], dict[str, Any]]:
    """(files, meta) for `CheckpointStore.save`."""
    tensors: dict[str, torch.Tensor] = {}
    # clone(): tied weights share storage, which safetensors refuses to save twice.
    for k, v in model.state_dict().items():
        tensors[f"model/{k}"] = v.detach().clone().contiguous()
    sd = opt.state_dict()
    scalars: dict[str, dict[str, Any]] = {}
    for pid, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"optim/{pid}/{k}"] = v.detach().clone().contiguous()
            else:
                scalars.setdefault(str(pid), {})[k] = v
    tensors["rng/torch"] = torch.get_rng_state()
    py_state = random.getstate()
    np_state = np.random.get_state()
    meta = {
        **counters,
        "param_groups": sd["param_groups"],
        "optim_scalars": scalars,
        "rng_python": [py_state[0], list(py_state[1]), py_state[2]],
        "rng_numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
    }
    return {TENSORS: st_save(tensors)}, meta


def restore(model: torch.nn.Module, opt: torch.optim.Optimizer, files: dict[str, bytes],
            meta: dict[str, Any]) -> None:
    """Load what `capture` wrote into `model` and `opt`, and reset every RNG."""
    tensors = st_load(files[TENSORS])
    model_sd = {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}
    model.load_state_dict(model_sd, strict=True)
    state: dict[int, dict[str, Any]] = {}
    for k, v in tensors.items():
        if k.startswith("optim/"):
            _, pid, name = k.split("/", 2)
            state.setdefault(int(pid), {})[name] = v
    for pid, sc in meta["optim_scalars"].items():
        state.setdefault(int(pid), {}).update(sc)
    groups = [{**g, "betas": tuple(g["betas"])} if "betas" in g else g for g in meta["param_groups"]]
    opt.load_state_dict({"state": state, "param_groups": groups})
    torch.set_rng_state(tensors["rng/torch"])
    v, s, g = meta["rng_python"]
    random.setstate((v, tuple(s), g))
    name, keys, *rest = meta["rng_numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
