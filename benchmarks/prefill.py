"""Held-out scoring and rollout generation on SmolLM2, with prompts' shared opening run
once (`HFEngine._prefill`) against every prompt run whole, in one process.

    python benchmarks/prefill.py [--flow examples/smollm2-math.yaml] [--eval-size 150]
        [--repeats 3] [--threads 2]

Both arms run alternately on the same engine and weights (the sharing turned off by an
unreachable `MIN_SHARED_PREFIX`), so load on the machine hits both alike. Prints the
median seconds of each arm, their ratio, and whether every greedy answer agreed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flow", default="examples/smollm2-math.yaml")
    ap.add_argument("--eval-size", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    from astraflow.config.loader import load_flow
    from astraflow.context import quiet_libraries
    from astraflow.models.hf import common_prefix
    from astraflow.rollout import engine as engine_mod
    from astraflow.rollout.engine import HFEngine
    from astraflow.workflows.workload import make_workflow

    quiet_libraries()
    torch.set_num_threads(args.threads)
    flow = load_flow(args.flow)
    eng = HFEngine.from_dir(Path(flow.policy.model.path), dtype="float32")
    wf = make_workflow(flow, eng.codec)
    role = flow.role_of(flow.policy.name)
    items = wf.eval_items(role, args.eval_size)
    prompts = [wf.encode_prompt(it.prompt) for it in items]
    rng = random.Random(0)
    batch = rng.sample(prompts, flow.rollout.prompts_per_batch)
    print(f"{len(prompts)} held-out prompts, {statistics.mean(map(len, prompts)):.1f} tokens "
          f"on average, {common_prefix(prompts)} shared by all")
    threshold = engine_mod.MIN_SHARED_PREFIX

    def score() -> tuple[float, list[list[int]]]:
        t = time.perf_counter()
        gen = eng.generate(prompts, max_new_tokens=wf.max_new_tokens(role), greedy=True)
        return time.perf_counter() - t, gen.completions

    def rollout() -> float:
        t = time.perf_counter()
        eng.generate(batch, max_new_tokens=flow.rollout.max_new_tokens,
                     samples_per_prompt=flow.rollout.samples_per_prompt,
                     temperature=flow.rollout.temperature,
                     generator=torch.Generator().manual_seed(0))
        return time.perf_counter() - t

    times: dict[str, dict[str, list[float]]] = {"shared": {"score": [], "rollout": []},
                                                 "whole": {"score": [], "rollout": []}}
    answers: dict[str, list[list[int]]] = {}
    for _ in range(args.repeats):
        for arm in ("shared", "whole"):
            engine_mod.MIN_SHARED_PREFIX = threshold if arm == "shared" else 10**9
            s, answers[arm] = score()
            times[arm]["score"].append(s)
            times[arm]["rollout"].append(rollout())
    engine_mod.MIN_SHARED_PREFIX = threshold
    agree = sum(a == b for a, b in zip(answers["shared"], answers["whole"], strict=True))
    for what in ("score", "rollout"):
        sh, wh = (statistics.median(times[a][what]) for a in ("shared", "whole"))
        label = (f"held-out scoring ({len(prompts)} prompts, greedy)" if what == "score" else
                 f"rollout batch ({len(batch)} prompts × {flow.rollout.samples_per_prompt})")
        print(f"{label}: shared opening {sh:.2f} s, whole prompts {wh:.2f} s, "
              f"ratio {sh / wh:.2f} (median of {args.repeats})")
    print(f"greedy answers identical: {agree}/{len(prompts)}")


if __name__ == "__main__":
    main()
