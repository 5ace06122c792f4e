"""The trainer's ranks: device choice, torch.distributed setup, FSDP2 sharding.

One trainer is one process, or N processes under `torchrun` (WORLD_SIZE/RANK in the
environment); the same `astraflow train RUN --policy P` command runs either way.

Who reads the store: rank 0 alone. It polls the trajectory table, runs the stages,
writes the ledger, progress, metrics and checkpoints' manifests, publishes, and
broadcasts each step's batch (token ids and per-token tensors, a few MB at most)
to the other ranks with `broadcast_object_list`. The alternative, every rank
reading its shard of the same commit range, was rejected: a step's range is
decided by a poll that races with appending workers, so the ranks would first
have to agree on it (a broadcast anyway); the stages (staleness by lineage,
filters, group advantages) need whole groups and may be stateful or random, so
every rank would have to run them on every row to get the same answer; and one
reader keeps the exactly-once ledger a single writer's, exactly as with one
process. The batch is tiny next to the gradients FSDP moves every step.

Each rank then trains on its contiguous share of every minibatch's rows
(`astraflow.train.loss.optimize` with `ranks`); FSDP2 (`fully_shard`) averages the
gradients, which the loss pre-scales by the world size so the update equals the
single-process one over the whole minibatch.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import torch

log = logging.getLogger("astraflow.trainer")


def resolve_device(pref: str, local_rank: int = 0) -> torch.device:
    """`auto`: CUDA if this process sees a GPU, else the CPU. `cuda` without one is an
    error, never a silent CPU run (that is how a rented GPU once trained on its CPU)."""
    if pref not in ("auto", "cpu", "cuda"):
        raise ValueError(f"trainer.device must be auto, cpu or cuda, got {pref!r}")
    if pref == "cpu" or (pref == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            "trainer.device is cuda but torch sees no CUDA device (torch "
            f"{torch.__version__}, CUDA build {torch.version.cuda}); set trainer.device: cpu "
            "or auto to train on the CPU")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def compute_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bfloat16 when matmuls should run in bf16 over float32 master weights; None for
    plain float32 (`auto`: bf16 on CUDA only)."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


@dataclass
class Ranks:
    """This process's place among the trainer's ranks (world 1: no process group)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    mesh: Any = None

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        return self.world > 1

    @classmethod
    def from_env(cls, device_pref: str = "auto") -> Ranks:
        """Read torchrun's environment; start the process group (gloo on the CPU, nccl
        on CUDA) and a 1-D device mesh when there is more than one rank."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = resolve_device(device_pref, local)
        if world == 1:
            return cls(device=device)
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        if device.type == "cuda":
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                    device_id=device if device.type == "cuda" else None)
        mesh = init_device_mesh(device.type, (world,))
        log.info("rank %d of %d on %s", rank, world, device)
        return cls(rank=rank, world=world, local_rank=local, device=device, mesh=mesh)

    def share(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (pickled; only ever our own objects)."""
        if not self.sharded:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.sharded:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def all_sum(self, values: list[float]) -> list[float]:
        """Element-wise sums over the ranks (float64, so token counts stay exact)."""
        if not self.sharded or not values:
            return values
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.cpu().tolist()

    def barrier(self) -> None:
        if self.sharded:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        if self.sharded:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def shard(wrapper: torch.nn.Module, policy: torch.nn.Module, ranks: Ranks,
          compute: torch.dtype | None) -> None:
    """FSDP2 over `ranks.mesh`: each decoder layer its own unit (all-gathered just in
    time, freed after), the embeddings, final norm and (tied) head in the root unit
    `wrapper`, whose forward runs the whole chunked-logprob pass so FSDP sees every
    parameter use inside a forward it hooks. Mixed precision: bf16 parameters for
    compute, float32 gradient reduction, float32 master copies in the optimizer."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = (MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
          if compute is not None else MixedPrecisionPolicy())
    layers = decoder_layers(policy)
    for layer in layers:
        fully_shard(layer, mesh=ranks.mesh, mp_policy=mp)
    fully_shard(wrapper, mesh=ranks.mesh, mp_policy=mp)


def decoder_layers(policy: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of an HF causal LM (`model.layers` for Llama-like models)."""
    backbone = policy.get_decoder() if hasattr(policy, "get_decoder") else None
    layers = getattr(backbone, "layers", None)
    if layers is None:
        raise TypeError(f"{type(policy).__name__}: no decoder layers to shard "
                        f"(expected get_decoder().layers)")
    return list(layers)
