"""One optimizer step (`astraflow.train.step.optimize`, or `fsdp.ShardedStep`) on a fixed batch, alone or as a
rank under torchrun (tests/test_distributed.py runs it both ways and compares).

    python -m tests.dist_step MODEL_DIR OUT_DIR [--objective ppo|decoupled]
        [--minibatches M] [--micro-batch-rows R] [--rows N] [--lr LR] [--max-update-kl KL]
        [--kl-coef C] [--entropy-floor H]

Writes OUT_DIR/weights.safetensors (the full updated weights, gathered on rank 0)
and OUT_DIR/metrics.json.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch


def fixed_batch(rows: int, vocab: int, seed: int = 0):
    """Rows of different lengths (so ranks' shares differ in tokens), seeded."""
    from astraflow.train.batch import Batch

    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(3, 8))] for _ in range(rows)]
    comps = [[rng.randrange(3, vocab) for _ in range(rng.randint(2, 9))] for _ in range(rows)]
    logps = [[-rng.uniform(0.1, 3.0) for _ in c] for c in comps]
    masks = [[1 if rng.random() < 0.85 else 0 for _ in c] for c in comps]
    advs = [rng.uniform(-1.0, 1.0) for _ in range(rows)]
    on_policy = [i % 2 == 0 for i in range(rows)]
    return Batch.from_rows(prompts, comps, logps, masks, advs, on_policy)


def step(model_dir: str, *, objective: str = "ppo", minibatches: int = 1,
         micro_batch_rows: int | None = None, rows: int = 4, lr: float = 1e-3,
         max_update_kl: float | None = None,
         max_update_kl_rows: int | None = None,
         kl_coef: float = 0.0,
         entropy_floor: float | None = None) -> tuple[dict[str, torch.Tensor] | None, dict[str, float]]:
    """(full weights after one step on rank 0, else None; metrics) — alone or sharded.
    `kl_coef`: a KL anchor to a reference that is the model with seeded noise added (the
    model itself would give a zero KL and no gradient to compare). `entropy_floor`: the
    entropy bonus under that floor, weight 0.5."""
    from astraflow.models.hf import load_policy
    from astraflow.train.dist import Ranks
    from astraflow.train.fsdp import ShardedStep, full_state_dict, shard
    from astraflow.train.logprobs import LogprobModel
    from astraflow.train.loss import LossConfig
    from astraflow.train.step import StepSettings, optimize

    torch.manual_seed(0)
    ranks = Ranks.from_env("cpu")
    model = load_policy(model_dir, dtype="float32")
    model.train()
    module: torch.nn.Module = model
    if ranks.sharded:
        module = LogprobModel(model, ranks.device)
        shard(module, model, ranks, None)
    opt = torch.optim.AdamW(module.parameters(), lr=lr, betas=(0.9, 0.99))
    batch = fixed_batch(rows, model.config.vocab_size)
    ref = None
    if kl_coef:
        ref = load_policy(model_dir, dtype="float32").eval().requires_grad_(False)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in ref.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    loss = LossConfig(objective, kl_coef=kl_coef, entropy_floor=entropy_floor, entropy_coef=0.5)
    settings = StepSettings(loss=loss, ref_model=ref,
                            minibatches=minibatches,
                            micro_batch_rows=micro_batch_rows, chunk_tokens=7,
                            max_update_kl=max_update_kl, max_update_kl_rows=max_update_kl_rows)
    run = ShardedStep(ranks) if ranks.sharded else optimize
    metrics, updates = run(module, opt, batch, 0, settings)
    metrics["updates"] = float(updates)
    full = full_state_dict(module)
    weights = {k: v.clone() for k, v in full.items()} if ranks.main else None
    ranks.close()
    return weights, metrics


def main() -> None:
    from safetensors.torch import save_file

    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--objective", default="ppo")
    ap.add_argument("--minibatches", type=int, default=1)
    ap.add_argument("--micro-batch-rows", type=int, default=None)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--max-update-kl", type=float, default=None)
    ap.add_argument("--max-update-kl-rows", type=int, default=None)
    ap.add_argument("--kl-coef", type=float, default=0.0)
    ap.add_argument("--entropy-floor", type=float, default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    weights, metrics = step(a.model_dir, objective=a.objective, minibatches=a.minibatches,
                            micro_batch_rows=a.micro_batch_rows, rows=a.rows, lr=a.lr,
                            max_update_kl=a.max_update_kl,
                            max_update_kl_rows=a.max_update_kl_rows, kl_coef=a.kl_coef,
                            entropy_floor=a.entropy_floor)
    if weights is not None:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        # Tied weights come back as one tensor under two names: store each name's copy.
        save_file({k: v.contiguous().clone() for k, v in weights.items()},
                  str(out / "weights.safetensors"))
        (out / "metrics.json").write_text(json.dumps(metrics))


if __name__ == "__main__":
    main()
