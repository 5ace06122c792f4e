"""On a CUDA GPU: the trainer's model where it should be, and a bf16 step that stays finite.

Skipped without CUDA (every test here is marked `gpu`; `scripts/gpu-check.sh` runs
them with `pytest -m gpu` and prints a report). Tests of `trainer.device` skip, saying
so, in a build whose trainer has no such field yet.
"""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

BATCH = 8


def _needs_trainer_device() -> None:
    from astraflow.config.components import TrainerSpec

    if "device" not in TrainerSpec.model_fields:
        pytest.skip("this build's trainer has no trainer.device (the distributed trainer of "
                    "issue 11 adds it)")


def _cuda_ctx(run, policy_dir):
    from tests.runs import seeded_run

    flow = {
        "name": "gpu", "policies": [{"name": "solver", "model": {
            "hidden_size": 64, "layers": 2, "heads": 2, "intermediate_size": 128},
            "algorithm": {"lr": 0.01}}],
        "env": {"digits": 2, "eval_size": 20},
        "rollout": {"prompts_per_batch": 2, "samples_per_prompt": 4},
        "trainer": {"checkpoint_every": 2, "device": "cuda"},
        "stages": [{"name": "group_advantages"}],
    }
    return seeded_run(run, flow, policy_dir)


def _on_cuda(tensors) -> bool:
    return all(t.device.type == "cuda" for t in tensors)


def test_trainer_model_on_cuda_after_restore(tmp_path, tiny_policy_dir):
    """A restored trainer (weights, optimizer state) trains on the GPU, not the host."""
    _needs_trainer_device()
    from astraflow.train.trainer import Trainer
    from tests.test_stores import make_rows

    ctx = _cuda_ctx(tmp_path / "run", tiny_policy_dir)
    first = Trainer(ctx)
    assert _on_cuda(first.model.parameters())
    for _ in range(3):
        ctx.trajectories().append("solver", make_rows("solver", BATCH))
        first.train_on(first.poll())
    del first  # killed after step 2: the checkpoint after step 1 is the newest
    resumed = Trainer(ctx)
    assert resumed.step == 2
    assert _on_cuda(resumed.model.parameters())
    state = [v for s in resumed.opt.state.values() for v in s.values()
             if torch.is_tensor(v) and v.dim() > 0]
    assert state and _on_cuda(state)
    res = resumed.train_on(resumed.poll())  # step 2 again, from the rows it lost
    assert res.rows_used == BATCH and math.isfinite(res.metrics["loss"])
    assert _on_cuda(resumed.model.parameters())


def test_bf16_autocast_step_is_finite():
    """bf16 compute under autocast, fp32 master weights and optimizer state: one policy
    step of the real loss gives finite logits, loss, gradients and weights."""
    from astraflow.models.factory import tiny_llama
    from astraflow.train.loss import LossConfig, policy_loss

    torch.manual_seed(0)
    model = tiny_llama(hidden_size=128, layers=4, heads=4, intermediate_size=512).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (16, 24), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(ids).logits
    assert logits.dtype == torch.bfloat16
    logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    flat = logp.reshape(-1)
    adv = torch.randn(16, 1, device="cuda").expand(-1, 23).reshape(-1)
    mask = torch.ones_like(flat)
    loss, _ = policy_loss(flat, flat.detach() - 0.01, adv, mask, LossConfig())
    assert torch.isfinite(loss)
    loss.backward()
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    opt.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(v.dtype == torch.float32 for s in opt.state.values() for v in s.values()
               if torch.is_tensor(v) and v.dim() > 0)
