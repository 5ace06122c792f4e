"""Peak trainer memory of one policy-gradient step: full-vocabulary logprobs vs chunked.

    python benchmarks/memory.py [--model runs/models/smollm2-135m-instruct | tiny]
                                [--rows 64] [--prompt-tokens 46] [--completion-tokens 60]
                                [--chunk-tokens 1024] [--threads 2]

One step = forward + backward of the PPO-clip loss (astraflow.train.loss) over
`rows` rows of `prompt-tokens` + `completion-tokens` random token ids, in train
mode, fp32 on CPU. No optimizer step: AdamW's state is the same for both
variants and would only dilute the ratio (add 2 × the parameter bytes to each).

    before    completion_logprobs_reference: logits and a float32 log-softmax over
              the whole vocabulary at every position of the batch (the old code)
    after     completion_logprobs: backbone once, then head + log-softmax only at
              completion positions, `chunk-tokens` at a time, each chunk under
              activation checkpointing
    after+mb  the same in micro-batches of `micro-batch-rows` rows, each loss
              divided by the step's total token count (algorithm.micro_batch_rows),
              one backward per micro-batch: the same gradient
    backbone  only the backbone's forward + backward (a loss on its hidden states):
              the floor no logprob computation can go below; `variant − backbone`
              is what the logprob computation itself costs

How it is measured: each variant runs in its own fresh subprocess. After the
model is loaded and one warm-up step on a single row has run (so lazily
allocated buffers and the allocator's arenas exist in both), the kernel's
peak-RSS counter is reset (`echo 5 > /proc/self/clear_refs`, Linux ≥ 4.0) and
the resident set is read; after the step, VmHWM (the peak since the reset)
minus that resident set is the step's peak extra memory, as the OS saw it.
That includes the parameter gradients (the same in both variants) and the
backbone's saved activations (the same too): only the logits part differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_MODEL = ROOT / "runs" / "models" / "smollm2-135m-instruct"
MiB = 1 << 20
VARIANTS = ("before", "after", "after+mb", "backbone")


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} (Linux only)")


def _reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError as err:
        raise RuntimeError(f"cannot reset the peak RSS counter ({err}); this benchmark needs "
                           f"Linux >= 4.0 with a writable /proc/self/clear_refs") from err


def _load(model: str):
    import torch

    if model == "tiny":
        from astraflow.models.factory import tiny_llama

        return tiny_llama(hidden_size=128, layers=4, heads=4, intermediate_size=512,
                          max_positions=256)
    from transformers import AutoModelForCausalLM

    path = Path(model)
    if not (path / "config.json").is_file():
        raise SystemExit(f"{path}: no HF model folder there (make it with `astraflow models "
                         f"import`, or pass --model tiny)")
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)


def measure(args: argparse.Namespace) -> dict[str, float]:
    """One variant in this process (the child's side)."""
    import gc

    import torch

    from astraflow.train.logprobs import completion_logprobs, completion_logprobs_reference
    from astraflow.train.loss import ppo_clip_loss

    torch.set_num_threads(args.threads)
    model = _load(args.model).train()
    vocab = int(model.get_output_embeddings().weight.shape[0])
    g = torch.Generator().manual_seed(0)

    def batch(rows: int) -> tuple[list[list[int]], list[list[int]]]:
        ids = torch.randint(3, vocab, (rows, args.prompt_tokens + args.completion_tokens),
                            generator=g).tolist()
        return [r[: args.prompt_tokens] for r in ids], [r[args.prompt_tokens :] for r in ids]

    def pass_(prompts: list[list[int]], comps: list[list[int]], total: float) -> None:
        if args.variant == "backbone":
            ids = torch.tensor([p + c for p, c in zip(prompts, comps, strict=True)])
            hidden = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state
            (hidden.float().pow(2).mean() / total).backward()
            return
        if args.variant == "before":
            new = completion_logprobs_reference(model, prompts, comps, 0)
        else:
            new = completion_logprobs(model, prompts, comps, 0,
                                      chunk_tokens=args.chunk_tokens).logprobs
        n = new.numel()
        old = new.detach() - 0.01
        adv = torch.where(torch.arange(n) % 2 == 0, 1.0, -1.0)
        loss, _ = ppo_clip_loss(new, old, adv, torch.ones(n), clip_eps=0.2, normalizer=total)
        loss.backward()

    def step(prompts: list[list[int]], comps: list[list[int]]) -> None:
        total = float(sum(len(c) for c in comps))
        mb = args.micro_batch_rows if args.variant == "after+mb" else len(prompts)
        for i in range(0, len(prompts), mb):
            pass_(prompts[i : i + mb], comps[i : i + mb], total)

    step(*batch(1))  # warm-up: lazy buffers, allocator arenas, the head check
    model.zero_grad(set_to_none=True)
    prompts, comps = batch(args.rows)
    gc.collect()
    _reset_peak()
    base = _status_kib("VmRSS")
    t0 = time.time()
    step(prompts, comps)
    took = time.time() - t0
    peak = _status_kib("VmHWM")
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters()
                if p.grad is not None)
    return {"peak_extra_mib": (peak - base) / 1024, "base_mib": base / 1024,
            "grads_mib": grads / MiB, "step_s": took,
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6, "vocab": vocab}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL),
                    help="an HF model folder, or `tiny` (the math flow's 1 M-parameter model)")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=46)
    ap.add_argument("--completion-tokens", type=int, default=60)
    ap.add_argument("--chunk-tokens", type=int, default=1024)
    ap.add_argument("--micro-batch-rows", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", default="before,after,after+mb,backbone",
                    help="which to measure, comma-separated (before is required)")
    ap.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.variant:  # the child: print one JSON line
        print(json.dumps(measure(args)))
        return
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or "before" not in variants:
        raise SystemExit(f"--variants: {unknown or 'before missing'}; choose from {VARIANTS}")
    results = {}
    for variant in variants:
        cmd = [sys.executable, __file__, "--variant", variant, "--model", args.model,
               "--rows", str(args.rows), "--prompt-tokens", str(args.prompt_tokens),
               "--completion-tokens", str(args.completion_tokens),
               "--chunk-tokens", str(args.chunk_tokens), "--threads", str(args.threads),
               "--micro-batch-rows", str(args.micro_batch_rows)]
        out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ,
                             "TOKENIZERS_PARALLELISM": "false"})
        if out.returncode != 0:
            raise SystemExit(f"{variant} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
        results[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    b = results["before"]
    tokens = args.rows * args.completion_tokens
    print(f"model {args.model}: {b['params_m']:.1f} M parameters, vocab {b['vocab']}, fp32, "
          f"{args.threads} threads")
    print(f"one step: {args.rows} rows x ({args.prompt_tokens} prompt + "
          f"{args.completion_tokens} completion) tokens = {tokens} completion tokens; "
          f"forward + backward of the PPO-clip loss, no optimizer step")
    print("peak RSS during the step above the RSS before it (VmHWM after a reset), each "
          "variant in its own process; every variant includes "
          f"{b['grads_mib']:.0f} MiB of parameter gradients")
    label = {"before": "before: full-vocabulary log-softmax",
             "after": f"after: chunked ({args.chunk_tokens} tokens/chunk)",
             "after+mb": f"after + micro-batches of {args.micro_batch_rows} rows",
             "backbone": "backbone only (floor)"}
    floor = results.get("backbone", {}).get("peak_extra_mib")
    for v, r in results.items():
        extra = "" if v == "before" else f"  before/this {b['peak_extra_mib'] / r['peak_extra_mib']:5.2f}x"
        above = "" if floor is None or v not in ("before", "after") else \
            f"  logprobs part {r['peak_extra_mib'] - floor:7.0f} MiB"
        print(f"  {label[v]:<42} {r['peak_extra_mib']:8.0f} MiB  step {r['step_s']:6.1f} s"
              f"{extra}{above}")
    if floor is not None and "after" in results:
        part_b = b["peak_extra_mib"] - floor
        part_a = results["after"]["peak_extra_mib"] - floor
        print(f"  the logprob computation alone (variant minus backbone): before {part_b:.0f} MiB, "
              f"after {part_a:.0f} MiB: {part_b / max(part_a, 1.0):.1f}x")
    full = args.rows * (args.prompt_tokens + args.completion_tokens - 1) * b["vocab"] * 4 / MiB
    print(f"  for scale: one full-vocabulary float32 tensor of this batch is {full:.0f} MiB; "
          f"one chunk's is {min(args.chunk_tokens, tokens) * b['vocab'] * 4 / MiB:.0f} MiB")


if __name__ == "__main__":
    main()
