"""Checks of the vLLM engine against the hf engine, run under the vLLM env's python.

    .venv-vllm/bin/python tests/vllm_check.py WORKDIR [--no-worker]

Starts ONE VLLMEngine (start-up dominates on CPU) and runs every engine check
on it, then, unless --no-worker, `astraflow rollout RUN --max-batches 2` with
`rollout.engine: vllm` in a subprocess. Prints one line `VLLM_CHECK_JSON {...}`
with the measurements; tests/test_vllm_engine.py asserts on them. The model is
the tiny Llama after a few AdamW steps of copying the first operand of a math
prompt (version A), then of copying the second (version B), so greedy outputs
depend on the prompt, end with EOS, and differ between the versions.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

import astraflow
from astraflow.envs.math import MathEnv
from astraflow.models.factory import save_policy, tiny_llama
from astraflow.models.tokenizer import CharCodec, build_char_tokenizer
from astraflow.rollout.engine import HFEngine

MAX_NEW = 8
TEMPERATURE = 1.5  # not 1, so temperature-scaled and raw logprobs differ


def train(model: torch.nn.Module, codec: CharCodec, steps: int, operand: int) -> None:
    """AdamW steps on a copy task over math prompts: `41+19=` → `41<eos>` (operand 0) or
    `19<eos>` (operand 1). Learnt in a few seconds, unlike addition, and the output
    depends on the prompt; the two targets make versions A and B answer differently."""
    env = MathEnv(digits=2)
    rng = random.Random(operand)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        tasks = [env.sample(rng) for _ in range(32)]
        n = len(codec.encode(tasks[0].prompt))  # fixed-width prompts: no padding
        ids = torch.tensor([codec.encode(t.prompt) + codec.encode(t.prompt[3 * operand:][:2])[1:]
                            + [codec.eos_id] for t in tasks])
        labels = ids.clone()
        labels[:, :n] = -100
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


@torch.no_grad()
def teacher_forced(model: torch.nn.Module, prompt: list[int], comp: list[int],
                   temperature: float) -> list[float]:
    """logprob of each completion token under softmax(logits / temperature), one pass."""
    ids = torch.tensor([prompt + comp])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(comp)[:, None])[:, 0].tolist()


def compare(a: list[list[int]], b: list[list[int]], la: list[list[float]],
            lb: list[list[float]]) -> dict:
    """Sequences equal, and the max |logprob diff| over positions where both agree."""
    same = sum(x == y for x, y in zip(a, b, strict=True))
    diff = 0.0
    for x, y, p, q in zip(a, b, la, lb, strict=True):
        for t in range(min(len(x), len(y))):
            if x[t] != y[t]:
                break
            diff = max(diff, abs(p[t] - q[t]))
    return {"match": same, "of": len(a), "max_logprob_diff": diff}


def eos_ok(comps: list[list[int]], eos: int) -> bool:
    """EOS only as the last token, and every completion shorter than the cap ends with it."""
    return all(eos not in c[:-1] and (len(c) == MAX_NEW or c[-1] == eos) for c in comps)


def engine_checks(work: Path, out: dict) -> None:
    from astraflow.rollout.vllm_engine import VLLMEngine

    codec = CharCodec.default()
    t0 = time.time()
    torch.manual_seed(0)
    model = tiny_llama(seed=0)
    train(model, codec, steps=40, operand=0)
    save_policy(model, build_char_tokenizer(), work / "A")
    train(model, codec, steps=40, operand=1)
    save_policy(model, build_char_tokenizer(), work / "B")
    out["train_s"] = time.time() - t0

    env = MathEnv(digits=2)
    rng = random.Random(7)
    tasks = [env.sample(rng) for _ in range(16)]
    prompts = [codec.encode(t.prompt) for t in tasks]
    # Longer than one 32-token KV block: prefix caching would reuse its first block.
    long_prompt = codec.encode(";".join(t.prompt + t.answer for t in tasks[:4]) + ";" + tasks[4].prompt)
    assert 32 < len(long_prompt) <= 64 - MAX_NEW, len(long_prompt)

    hf_a, hf_b = HFEngine.from_dir(work / "A"), HFEngine.from_dir(work / "B")
    t0 = time.time()
    eng = VLLMEngine.from_dir(work / "A", block_size=32)
    out["startup_s"] = time.time() - t0
    llm_id = id(eng.llm)

    # 1. greedy: same tokens, close logprobs
    t0 = time.time()
    v = eng.generate(prompts + [long_prompt], max_new_tokens=MAX_NEW, greedy=True)
    out["first_generate_s"] = time.time() - t0
    t0 = time.time()
    v = eng.generate(prompts + [long_prompt], max_new_tokens=MAX_NEW, greedy=True)
    out["greedy_generate_s"] = time.time() - t0
    h = hf_a.generate(prompts + [long_prompt], max_new_tokens=MAX_NEW, greedy=True)
    out["greedy"] = compare(v.completions, h.completions, v.logprobs, h.logprobs)
    out["greedy"]["eos_ok"] = eos_ok(v.completions, codec.eos_id)
    out["greedy"]["ended_with_eos"] = sum(c[-1:] == [codec.eos_id] for c in v.completions)
    out["greedy"]["examples"] = [f"{t.prompt}{codec.decode(c)}" for t, c in
                                 zip(tasks[:4], v.completions, strict=False)]
    out["greedy"]["distinct_outputs"] = len({tuple(c) for c in v.completions})
    g2 = eng.generate(prompts[:3], max_new_tokens=MAX_NEW, greedy=True, samples_per_prompt=2)
    out["greedy"]["repeat_ok"] = g2.completions == [c for c in v.completions[:3] for _ in (0, 1)]

    # 2. sampling at temperature T: logprobs are the temperature-scaled ones HF gives
    k = 4
    s = eng.generate(prompts, max_new_tokens=MAX_NEW, samples_per_prompt=k,
                     temperature=TEMPERATURE, generator=torch.Generator().manual_seed(3))
    s2 = eng.generate(prompts, max_new_tokens=MAX_NEW, samples_per_prompt=k,
                      temperature=TEMPERATURE, generator=torch.Generator().manual_seed(3))
    diff_t = diff_raw = 0.0
    for i, (c, lp) in enumerate(zip(s.completions, s.logprobs, strict=True)):
        ref_t = teacher_forced(hf_a.model, prompts[i // k], c, TEMPERATURE)
        ref_1 = teacher_forced(hf_a.model, prompts[i // k], c, 1.0)
        diff_t = max(diff_t, *(abs(x - y) for x, y in zip(lp, ref_t, strict=True)))
        diff_raw = max(diff_raw, *(abs(x - y) for x, y in zip(lp, ref_1, strict=True)))
    out["sampled"] = {
        "n": len(s.completions), "max_logprob_diff": diff_t,
        "max_diff_vs_temperature_1": diff_raw, "eos_ok": eos_ok(s.completions, codec.eos_id),
        "distinct_outputs": len({tuple(c) for c in s.completions}),
        "reproducible": s.completions == s2.completions,
        "lengths_match_logprobs": all(len(c) == len(lp) for c, lp in
                                      zip(s.completions, s.logprobs, strict=True)),
    }

    # 3. reload a different version in place
    t0 = time.time()
    eng.load_weights(work / "B")
    out["reload_ms"] = (time.time() - t0) * 1000
    vb = eng.generate(prompts + [long_prompt], max_new_tokens=MAX_NEW, greedy=True)
    hb = hf_b.generate(prompts + [long_prompt], max_new_tokens=MAX_NEW, greedy=True)
    out["reload"] = compare(vb.completions, hb.completions, vb.logprobs, hb.logprobs)
    out["reload"]["long_prompt_matches"] = vb.completions[-1] == hb.completions[-1]
    out["reload"]["changed_vs_old"] = sum(x != y for x, y in
                                          zip(vb.completions, v.completions, strict=True))
    out["reload"]["same_llm_object"] = id(eng.llm) == llm_id
    out["reload"]["hf_versions_differ"] = sum(x != y for x, y in
                                              zip(hb.completions, h.completions, strict=True))
    del eng


def worker_check(work: Path, out: dict) -> None:
    """`astraflow rollout RUN --max-batches 2` with rollout.engine: vllm."""
    import shutil

    from astraflow.config.loader import parse_flow
    from astraflow.context import RESOLVED, RunContext

    flow = parse_flow({
        "name": "vw", "policies": [{"name": "solver"}],  # the default tiny model (head size 32)
        "env": {"digits": 2, "eval_size": 20},
        "rollout": {"engine": "vllm", "prompts_per_batch": 4, "samples_per_prompt": 4,
                    "max_backlog_batches": 4},
    })
    run = work / "run"
    run.mkdir()
    (run / RESOLVED).write_text(flow.dump())
    ctx = RunContext(flow, run)
    ws = ctx.weights()
    st = ws.staging_dir("solver")
    for f in (work / "A").iterdir():
        shutil.copy(f, st)
    ws.publish("solver", st, step=0)
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "astraflow", "rollout", str(run),
                        "--max-batches", "2"], capture_output=True, text=True, timeout=600)
    out["worker_s"] = time.time() - t0
    out["worker_rc"] = r.returncode
    if r.returncode:
        out["worker_tail"] = (r.stdout + r.stderr)[-3000:]
        return
    rows = ctx.trajectories().read_range("solver", 0, 10**9).to_pylist()
    out["worker"] = {
        "rows": len(rows),
        "versions": sorted({r["behavior_version"] for r in rows}),
        "logprobs_ok": all(len(r["completion_ids"]) == len(r["behavior_logprobs"]) > 0
                           and all(lp <= 0 for lp in r["behavior_logprobs"]) for r in rows),
        "reward_mean": sum(r["reward"] for r in rows) / max(len(rows), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--no-worker", action="store_true")
    args = ap.parse_args()
    import vllm

    out: dict = {"vllm": vllm.__version__, "torch": torch.__version__,
                 "astraflow_file": astraflow.__file__}
    args.workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    engine_checks(args.workdir, out)
    out["engine_checks_s"] = time.time() - t0
    if not args.no_worker:
        worker_check(args.workdir, out)
    print("VLLM_CHECK_JSON " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
