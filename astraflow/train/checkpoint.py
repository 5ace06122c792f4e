"""Turn a trainer's state into checkpoint files and back — tensors as safetensors, the rest JSON.

Why not `torch.save`: a checkpoint may come back from a shared bucket, and
unpickling runs code. Model and optimizer tensors go into one safetensors
file under `model/…`, `optim/<param>/<key>` and `rng/torch` keys; everything
else (step, cursor, param groups, Python and NumPy RNG) is plain JSON. With CUDA the
GPU's RNG state is kept too (`rng/cuda`).

Sharded trainers (several ranks, FSDP2) write through `torch.distributed.checkpoint`
(DCP) instead: every rank saves its own shards of the model and optimizer tensors
with DCP's Hugging Face storage writer, which writes safetensors whose headers
record each shard's offsets (no pickled metadata file), and DCP reads them back at
any world size: 2 ranks resume on 1, or on 4. `capture_sharded`/`restore_sharded`;
`restore_any` reads either layout into either kind of model (a single-process file
into shards too), so a run can change its rank count.
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
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["rng/cuda"] = torch.cuda.get_rng_state()
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
    if "rng/cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng/cuda"])
    v, s, g = meta["rng_python"]
    random.setstate((v, tuple(s), g))
    name, keys, *rest = meta["rng_numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))


# --------------------------------------------------------------------------- sharded (DCP)
LAYOUT = "dcp-hf"
"""`meta["layout"]` of a checkpoint written by `capture_sharded`."""
WRAPPER_PREFIX = "policy."
"""State-dict prefix of the HF model inside `astraflow.train.logprobs.LogprobModel`; keys are
stored without it, so a plain model (one process) and a wrapped one share a layout."""


def _rng_meta() -> dict[str, Any]:
    py_state = random.getstate()
    np_state = np.random.get_state()
    out: dict[str, Any] = {
        "rng_python": [py_state[0], list(py_state[1]), py_state[2]],
        "rng_numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        "rng_torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["rng_cuda"] = torch.cuda.get_rng_state().tolist()
    return out


def _set_rng(meta: dict[str, Any]) -> None:
    torch.set_rng_state(torch.tensor(meta["rng_torch"], dtype=torch.uint8))
    if "rng_cuda" in meta and torch.cuda.is_available():
        torch.cuda.set_rng_state(torch.tensor(meta["rng_cuda"], dtype=torch.uint8))
    v, s, g = meta["rng_python"]
    random.setstate((v, tuple(s), g))
    name, keys, *rest = meta["rng_numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))


def _strip(key: str) -> str:
    return key[len(WRAPPER_PREFIX):] if key.startswith(WRAPPER_PREFIX) else key


def _storage(t: torch.Tensor) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.untyped_storage().data_ptr()


def _flat(module: torch.nn.Module, opt: torch.optim.Optimizer
          ) -> tuple[dict[str, torch.Tensor], dict[str, str], dict[str, Any], dict[str, Any]]:
    """(DCP's flat tensor dict, tied key → the key it shares storage with, the full model
    and optimizer state dicts). Tied weights are stored once (safetensors refuses shared
    storage); prefixes are stripped (`WRAPPER_PREFIX`)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    msd = get_model_state_dict(module)
    osd = get_optimizer_state_dict(module, opt)  # initialises a fresh optimizer's state
    flat: dict[str, torch.Tensor] = {}
    tied: dict[str, str] = {}
    seen: dict[int, str] = {}
    for k, v in msd.items():
        ptr = _storage(v)
        if ptr in seen:
            tied[k] = seen[ptr]
            continue
        seen[ptr] = k
        flat[f"model.{_strip(k)}"] = v
    for fqn, st in osd["state"].items():
        for name, v in st.items():
            if not torch.is_tensor(v):
                raise TypeError(f"optimizer state {fqn}/{name} is not a tensor ({type(v).__name__}): "
                                f"the sharded checkpoint stores tensors only")
            flat[f"optim.{_strip(fqn)}.{name}"] = v
    return flat, tied, msd, osd


def capture_sharded(module: torch.nn.Module, opt: torch.optim.Optimizer,
                    counters: dict[str, Any], workdir: str) -> tuple[dict[str, bytes], dict[str, Any]]:
    """This rank's checkpoint files and the meta (rank 0's is the one kept): a collective
    — every rank calls it. `workdir`: an empty local folder of this rank's."""
    import os

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    flat, _, _, osd = _flat(module, opt)
    dcp.save(flat, storage_writer=HuggingFaceStorageWriter(workdir, save_distributed=True))
    files = {}
    for name in sorted(os.listdir(workdir)):
        with open(os.path.join(workdir, name), "rb") as f:
            files[name] = f.read()
    groups = [{**g, "params": [_strip(p) for p in g["params"]]} for g in osd["param_groups"]]
    return files, {**counters, "layout": LAYOUT, "param_groups": groups, **_rng_meta()}


def restore_sharded(module: torch.nn.Module, opt: torch.optim.Optimizer, files: dict[str, bytes],
                    meta: dict[str, Any], workdir: str) -> None:
    """Load a `capture_sharded` checkpoint, written at any world size, into `module` and
    `opt` (sharded or not: DCP reads the slices each rank holds), and reset every RNG."""
    import os

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    for name, data in files.items():
        with open(os.path.join(workdir, name), "wb") as f:
            f.write(data)
    flat, tied, msd, osd = _flat(module, opt)
    dcp.load(flat, storage_reader=HuggingFaceStorageReader(workdir))
    prefix = {_strip(k): k for k in msd}
    model_sd = {prefix[k[len("model."):]]: v for k, v in flat.items() if k.startswith("model.")}
    for k, src in tied.items():
        model_sd[k] = model_sd[src]
    set_model_state_dict(module, model_sd)
    for fqn, st in osd["state"].items():
        for name in st:
            st[name] = flat[f"optim.{_strip(fqn)}.{name}"]
    opt_prefix = {_strip(p): p for g in osd["param_groups"] for p in g["params"]}
    osd["param_groups"] = [
        {**g, "params": [opt_prefix[p] for p in g["params"]],
         **({"betas": tuple(g["betas"])} if "betas" in g else {})}
        for g in meta["param_groups"]]
    set_optimizer_state_dict(module, opt, osd)
    _set_rng(meta)


def restore_any(module: torch.nn.Module, opt: torch.optim.Optimizer, files: dict[str, bytes],
                meta: dict[str, Any], workdir: str | None = None) -> None:
    """Either layout into either kind of model: a run may change its rank count."""
    import tempfile

    if meta.get("layout") == LAYOUT:
        if workdir is not None:
            restore_sharded(module, opt, files, meta, workdir)
            return
        with tempfile.TemporaryDirectory(prefix="astraflow-ckpt-") as tmp:
            restore_sharded(module, opt, files, meta, tmp)
        return
    if TENSORS not in files:
        raise ValueError(f"checkpoint has neither {TENSORS} nor layout {LAYOUT!r}: "
                         f"files {sorted(files)}")
    if any(hasattr(p, "to_local") for p in module.parameters()):
        restore_full_into_sharded(module, opt, files, meta)
        return
    restore(module, opt, files, meta)


def restore_full_into_sharded(module: torch.nn.Module, opt: torch.optim.Optimizer,
                              files: dict[str, bytes], meta: dict[str, Any]) -> None:
    """A single-process checkpoint into a sharded module: every rank reads the whole
    file and cuts out its own slices (no communication). The optimizer state of
    parameter number i (its index in the single-process optimizer, which follows
    `named_parameters()`) goes to that parameter's name."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.tensor import DTensor, distribute_tensor

    def local(full: torch.Tensor, like: Any) -> torch.Tensor:
        if isinstance(like, DTensor):
            return distribute_tensor(full.to(like.dtype), like.device_mesh, like.placements,
                                     src_data_rank=None)
        return full.to(like.dtype) if torch.is_tensor(like) else full

    tensors = st_load(files[TENSORS])
    msd = get_model_state_dict(module)
    set_model_state_dict(module, {k: local(tensors[f"model/{_strip(k)}"], v)
                                  for k, v in msd.items()})
    names = [n for n, _ in module.named_parameters()]
    pid_of = {n: i for i, n in enumerate(names)}
    osd = get_optimizer_state_dict(module, opt)
    for fqn, st in osd["state"].items():
        pid = pid_of[fqn]
        for name in st:
            key = f"optim/{pid}/{name}"
            if key in tensors:
                st[name] = local(tensors[key], st[name])
            else:
                st[name] = meta["optim_scalars"][str(pid)][name]
    groups, start = [], 0
    for g in meta["param_groups"]:
        count = len(g["params"])
        groups.append({**g, "params": names[start:start + count],
                       **({"betas": tuple(g["betas"])} if "betas" in g else {})})
        start += count
    osd["param_groups"] = groups
    set_optimizer_state_dict(module, opt, osd)
    torch.set_rng_state(tensors["rng/torch"])
    v, s, g = meta["rng_python"]
    random.setstate((v, tuple(s), g))
    name, keys, *rest = meta["rng_numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
