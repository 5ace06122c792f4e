"""The trainer's ranks: device choice and torch.distributed setup.

One trainer is one process, or N processes under `torchrun` (WORLD_SIZE/RANK in the
environment); the same `astraflow train RUN --policy P` command runs either way.
Rank 0 alone reads the store: it polls the trajectory table, runs the stages, writes
the ledger, progress, metrics and checkpoint manifests, publishes, and broadcasts each
step's batch (a few MB) to the other ranks. One reader keeps the exactly-once ledger a
single writer's and lets stateful or random stages see whole groups once; the batch is
tiny next to the gradients FSDP2 moves (astraflow/train/fsdp.py trains the shards).
"""

from __future__ import annotations

import logging
import os
import resource
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
                # Every rank past its last collective before any tears the group down:
                # a rank destroying gloo's pairs while its peer still uses them is the
                # common cause of a "terminate called" abort at exit under load.
                dist.barrier()
                dist.destroy_process_group()


def peak_memory_mb(device: torch.device) -> dict[str, float]:
    """The process's peak resident memory so far (MiB; Linux reports ru_maxrss in KiB),
    and on CUDA the peak the allocator handed out: what a user sizes machines by."""
    out = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if device.type == "cuda":
        out["cuda_peak_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out
