"""vLLM serving LoRA adapter versions against the hf engine's merged weights, run
under the vLLM env's python:

    .venv-vllm/bin/python tests/vllm_lora_check.py WORKDIR

WORKDIR holds what tests/test_lora.py made in the main env (the vLLM env has no
peft, and serving needs none): v00000000, the tiny Llama trained a few steps to
copy a math prompt's first operand (tests/vllm_check.py's task); v00000001 and
v00000002, LoRA adapters on it trained to copy the second operand, published as
the trainer publishes them. ONE vLLM engine starts on v0 with LoRA enabled and
swaps in v1, then v2, as LoRA requests; the hf engine merges the same adapters.
Prints one line `VLLM_LORA_JSON {...}`; tests/test_lora.py asserts on it.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import torch

import astraflow
from astraflow.envs.math import MathEnv
from astraflow.models.tokenizer import CharCodec
from astraflow.rollout.engine import HFEngine

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_check import MAX_NEW, TEMPERATURE, compare, teacher_forced  # noqa: E402


def main(work: Path) -> None:
    from astraflow.rollout.vllm_engine import VLLMEngine

    torch.set_num_threads(1)
    out: dict = {"astraflow_file": astraflow.__file__}
    codec = CharCodec.default()
    v0 = work / "v00000000"
    out["peft_importable"] = "peft" in sys.modules

    env = MathEnv(digits=2)
    rng = random.Random(7)
    prompts = [codec.encode(env.sample(rng).prompt) for _ in range(16)]
    hf = HFEngine.from_dir(v0)
    base = hf.generate(prompts, max_new_tokens=MAX_NEW, greedy=True)

    t0 = time.time()
    eng = VLLMEngine.from_dir(v0, max_lora_rank=8)
    out["startup_s"] = time.time() - t0
    v = eng.generate(prompts, max_new_tokens=MAX_NEW, greedy=True)
    out["v0"] = compare(v.completions, base.completions, v.logprobs, base.logprobs)
    for name in ("v00000001", "v00000002"):
        t0 = time.time()
        eng.load_weights(work / name)
        hf.load_weights(work / name)
        out[f"{name}_swap_s"] = time.time() - t0
        v = eng.generate(prompts, max_new_tokens=MAX_NEW, greedy=True)
        h = hf.generate(prompts, max_new_tokens=MAX_NEW, greedy=True)
        res = compare(v.completions, h.completions, v.logprobs, h.logprobs)
        res["changed_vs_base"] = sum(a != b for a, b in zip(v.completions, base.completions,
                                                            strict=True))
        # sampled: vLLM's temperature-scaled logprobs vs teacher-forced merged weights
        s = eng.generate(prompts[:8], max_new_tokens=MAX_NEW, samples_per_prompt=2,
                         temperature=TEMPERATURE, generator=torch.Generator().manual_seed(1))
        diff = 0.0
        for i, (c, lp) in enumerate(zip(s.completions, s.logprobs, strict=True)):
            ref = teacher_forced(hf.model, prompts[i // 2], c, TEMPERATURE)
            diff = max(diff, *(abs(x - y) for x, y in zip(lp, ref, strict=True)))
        res["sampled_max_logprob_diff"] = diff
        out[name] = res
    out["lora_requests"] = eng._lora_ids
    print("VLLM_LORA_JSON " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
