"""One GPU shared by a vLLM worker and a trainer: the two memory shares, checked and applied."""

from __future__ import annotations

import pytest

from astraflow.config.loader import FlowError, parse_flow

BASE = {"name": "colo", "policies": [{"name": "solver"}]}


def test_shares_that_overflow_one_gpu_are_refused():
    ok = parse_flow({**BASE, "rollout": {"engine": "vllm", "gpu_memory_utilization": 0.4},
                     "trainer": {"gpu_memory_fraction": 0.5}})
    assert ok.rollout.gpu_memory_utilization == 0.4 and ok.trainer.gpu_memory_fraction == 0.5
    with pytest.raises(FlowError, match="exceed one GPU's memory"):
        parse_flow({**BASE, "rollout": {"engine": "vllm", "gpu_memory_utilization": 0.6},
                    "trainer": {"gpu_memory_fraction": 0.5}})
    with pytest.raises(FlowError, match="sizes the vllm engine"):
        parse_flow({**BASE, "rollout": {"gpu_memory_utilization": 0.4}})


def test_the_worker_hands_vllm_its_share(monkeypatch, tmp_path):
    from astraflow.rollout import engine as engine_mod
    from astraflow.rollout import vllm_engine

    seen: dict = {}
    monkeypatch.setattr(engine_mod, "check_engine", lambda kind: None)
    monkeypatch.setattr(vllm_engine.VLLMEngine, "from_dir",
                        classmethod(lambda cls, path, **kw: seen.update(kw) or "engine"))
    assert engine_mod.make_engine("vllm", tmp_path, gpu_memory_utilization=0.4) == "engine"
    assert seen == {"max_lora_rank": None, "gpu_memory_utilization": 0.4}
    seen.clear()
    engine_mod.make_engine("vllm", tmp_path)
    assert "gpu_memory_utilization" not in seen  # vLLM's own default


@pytest.mark.gpu
def test_trainer_caps_its_share_of_the_gpu(tmp_path, tiny_policy_dir):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from astraflow.train.trainer import Trainer
    from tests.runs import seeded_run

    ctx = seeded_run(tmp_path / "run", {**BASE, "trainer": {"device": "cuda",
                                                            "gpu_memory_fraction": 0.25}},
                     tiny_policy_dir)
    Trainer(ctx)
    total = torch.cuda.get_device_properties(0).total_memory
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(int(total * 0.3), dtype=torch.uint8, device="cuda")
