"""A real pretrained model through AstraFlow against a bare single-process RL loop.

    python benchmarks/pretrained.py [--flow examples/smollm2-math.yaml] [--minutes 15]
                                     [--points 40] [--skip-flow] [--skip-bare] [--set k=v]

Both learn the flow's workload (SmolLM2-135M-Instruct on "What is a + b?" by
default) from the same pretrained weights with the same settings: batch size,
samples per prompt, temperature, max new tokens, AdamW and its lr, gradient
clip, group-normalised advantages with zero-variance groups skipped. The
baseline is the throwaway loop DESIGN.md measured: transformers `generate`
(sampling, no top-k/top-p) and one policy-gradient step per batch, fp32, all
cores, in one process, with none of AstraFlow's machinery (store, processes,
versions, ledger). It prints, for each, held-out accuracy over time and the
time to reach version 0's accuracy + `--points`, and the ratio
AstraFlow / bare (the issue's aim: at most 1.5).

Timing, the same for both: evaluation is off the clock. The bare loop stops its
clock while it evaluates after every step; AstraFlow runs with its live
evaluation off (it would share the same cores with the components) and keeps
every version it publishes; afterwards each version is evaluated in order, at
the time its manifest was written, counted from the moment the components
started (after version 0 is published). The first evaluated point at or above
the target gives the time to target. `--live-eval` keeps the launcher's live
curve instead (what `astraflow run` shows; it takes cores from the run).
Absolute seconds depend on the machine; the ratio is the claim.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
import yaml
from common import metric_means
from rich.console import Console

from astraflow.config.flow import FlowSpec
from astraflow.config.loader import load_flow
from astraflow.context import quiet_libraries
from astraflow.workflows.workload import make_env


def bare_loop(flow: FlowSpec, minutes: float, points: float, console: Console,
              eval_every: int = 1) -> dict:
    """Generate → score → one policy-gradient step, in one process, timed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    pol = flow.policy
    path = pol.model.path
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    env = make_env(flow)
    ro, algo = flow.rollout, pol.algorithm
    k, n_prompts = ro.samples_per_prompt, ro.prompts_per_batch
    max_new = ro.max_new_tokens or env.max_new_tokens()
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    stop_ids = [tok.eos_token_id]
    held = env.eval_tasks(flow.env.eval_size)
    opt = torch.optim.AdamW(model.parameters(), lr=algo.lr, betas=algo.betas,
                            weight_decay=algo.weight_decay)
    rng = random.Random(flow.seed)
    torch.manual_seed(flow.seed)

    def encode(prompts: list[str]) -> dict:
        texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                         add_generation_prompt=True) for p in prompts]
        tok.padding_side = "left"
        return tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)

    @torch.no_grad()
    def evaluate() -> float:
        model.eval()
        right = 0
        for i in range(0, len(held), 50):
            chunk = held[i : i + 50]
            enc = encode([t.prompt for t in chunk])
            out = model.generate(**enc, do_sample=False, max_new_tokens=max_new,
                                 pad_token_id=pad, eos_token_id=stop_ids)
            for t, row in zip(chunk, out[:, enc["input_ids"].shape[1]:], strict=True):
                right += env.reward(t, tok.decode(row, skip_special_tokens=True)) == 1.0
        return right / len(held)

    acc0 = evaluate()
    target = acc0 + points / 100
    console.print(f"bare loop: v0 held-out accuracy {acc0:.1%}; target {target:.1%}")
    curve = [(0.0, 0, acc0)]
    clock, step, reached = 0.0, 0, None
    gen_s = train_s = 0.0
    while clock < minutes * 60:
        t0 = time.perf_counter()
        tasks = [env.sample(rng) for _ in range(n_prompts)]
        enc = encode([t.prompt for t in tasks])
        model.eval()
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, temperature=ro.temperature, top_k=0,
                                 top_p=1.0, max_new_tokens=max_new, num_return_sequences=k,
                                 pad_token_id=pad, eos_token_id=stop_ids)
        width = enc["input_ids"].shape[1]
        comps = out[:, width:]
        rewards = torch.tensor([env.reward(tasks[i // k], tok.decode(c, skip_special_tokens=True))
                                for i, c in enumerate(comps)])
        t1 = time.perf_counter()
        gen_s += t1 - t0
        groups = rewards.view(n_prompts, k)
        std = groups.std(dim=1, unbiased=False)
        adv = ((groups - groups.mean(dim=1, keepdim=True)) / (std[:, None] + 1e-6)).flatten()
        keep = (std > 0).repeat_interleave(k)
        if keep.any():
            model.train()
            seqs = out[keep]
            prompt_mask = enc["attention_mask"].repeat_interleave(k, 0)[keep]
            comp = comps[keep]
            # completion tokens up to and including the first stop id
            is_stop = torch.isin(comp, torch.tensor(stop_ids))
            upto = torch.cumsum(is_stop.int(), dim=1) - is_stop.int()
            comp_mask = (upto == 0).to(prompt_mask.dtype)
            attn = torch.cat([prompt_mask, comp_mask], dim=1)
            pos = (attn.cumsum(-1) - 1).clamp(min=0)
            logits = model(input_ids=seqs, attention_mask=attn, position_ids=pos).logits
            logits = logits[:, width - 1 : -1].float() / ro.temperature
            logp = torch.log_softmax(logits, -1).gather(-1, comp[..., None]).squeeze(-1)
            mask = comp_mask.float()
            loss = -(logp * adv[keep][:, None] * mask).sum() / mask.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), algo.grad_clip)
            opt.step()
        train_s += time.perf_counter() - t1
        clock += time.perf_counter() - t0
        step += 1
        if step % eval_every == 0:
            acc = evaluate()  # the clock is stopped meanwhile
            curve.append((clock, step, acc))
            console.print(f"  bare step {step:4d} at {clock:6.1f}s: held-out {acc:.1%} "
                          f"(generate {gen_s / step:.2f}s, train {train_s / step:.2f}s per step)")
            if acc >= target and reached is None:
                reached = clock
                break
    return {"accuracy_v0": acc0, "target": target, "time_to_target_s": reached, "curve": curve,
            "steps": step, "generate_s_per_step": gen_s / max(step, 1),
            "train_s_per_step": train_s / max(step, 1)}


def run_keeping_versions(flow_path: str, minutes: float, console: Console, sets: dict,
                         *, name: str = "bench-pretrained", live_eval: bool = False):
    """`astraflow run` of the flow for `minutes` under runs/`name`; unless `live_eval`,
    with no evaluation beside the run and every version kept for the evaluation after
    it. Returns the run's context and summary (benchmarks/peers/ runs it this way too)."""
    from astraflow.local.launcher import prepare_run, run_local

    over = {"stop.max_minutes": minutes, "name": name, **sets}
    if not live_eval:
        over |= {"stop.eval_every_s": 1e9, "stop.target_accuracy": None,
                 "store.keep_last": 100_000}
    ctx = prepare_run(load_flow(flow_path, over), Path("runs"), overwrite=True)
    return ctx, run_local(ctx, console)


def astraflow_run(flow_path: str, minutes: float, points: float, console: Console,
                  sets: dict, live_eval: bool = False) -> dict:
    from astraflow.local.evaluate import Evaluator

    ctx, summary = run_keeping_versions(flow_path, minutes, console, sets, live_eval=live_eval)
    pol = summary["policy"]
    acc0 = summary["accuracy_v0"]
    target = acc0 + points / 100
    if live_eval:
        curve = [(p["t"], p["version"][pol], p["accuracy"][pol]) for p in summary["live_eval"]]
    else:
        ev, ws, curve = Evaluator(ctx, pol), ctx.weights(), []
        for v in ws.versions(pol):
            if v == 0:
                continue
            t = ws.manifest(pol, v).time - summary["started_at"]
            curve.append((t, v, ev(v)))
            console.print(f"  astraflow v{v:3d} published at {t:6.1f}s: held-out {curve[-1][2]:.1%}")
            if curve[-1][2] >= target:
                break  # the time to target is known; later versions cannot change it
    reached = next((t for t, _, acc in curve if acc >= target), None)
    split = time_split(ctx, pol)
    console.print("  astraflow per step (mean): " + ", ".join(
        f"{k} {v:.2f}" for k, v in split.items()))
    return {"accuracy_v0": acc0, "target": target, "time_to_target_s": reached, "curve": curve,
            "accuracy_final": summary["accuracy_final"], "steps": summary["ledger"]["steps"],
            "run_dir": str(ctx.run_dir), "evaluation": "live" if live_eval else "off the clock",
            "split": split}


def time_split(ctx, policy: str) -> dict[str, float]:
    """Where a step's time went, from the run's metrics table: the trainer's step, its
    wait and publish, the worker's generation, weight reloads and backpressure (means),
    and the trainer's peak resident memory (the largest of its per-step readings)."""
    rows = ctx.ledger().read_metrics().to_pylist()
    out = metric_means(ctx, [("trainer", "step_time_s"), ("trainer", "trainer_wait_s"),
                             ("trainer", "publish_s"), ("rollout", "gen_s"),
                             ("rollout", "reload_s"), ("rollout", "backpressure_s")], policy, rows)
    peaks = [r["value"] for r in rows if r["component"] == "trainer" and r["name"] == "peak_rss_mb"]
    if peaks:
        out["trainer.peak_rss_mb"] = max(peaks)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flow", default="examples/smollm2-math.yaml")
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--points", type=float, default=40.0,
                    help="target: version 0's held-out accuracy plus this many points")
    ap.add_argument("--skip-flow", action="store_true")
    ap.add_argument("--skip-bare", action="store_true")
    ap.add_argument("--live-eval", action="store_true",
                    help="time AstraFlow by the launcher's live evaluation (on the run's cores)")
    ap.add_argument("--out", default="runs/bench-pretrained.json")
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="override a flow field for the AstraFlow run, e.g. "
                         "policies.0.algorithm.objective=decoupled")
    args = ap.parse_args()
    quiet_libraries()
    console = Console()
    flow = load_flow(args.flow)
    out: dict = {}
    if not args.skip_bare:
        torch.set_num_threads(2)
        out["bare"] = bare_loop(flow, args.minutes, args.points, console)
    if not args.skip_flow:
        sets = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.sets)}
        out["astraflow"] = astraflow_run(args.flow, args.minutes, args.points, console, sets,
                                         live_eval=args.live_eval)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    console.print(f"\n[bold]time to v0 + {args.points:.0f} points[/bold]")
    for name, r in out.items():
        t = r["time_to_target_s"]
        console.print(f"  {name:9s} v0 {r['accuracy_v0']:.1%} → target {r['target']:.1%}: "
                      + (f"{t:.0f}s" if t is not None else "not reached")
                      + f" ({r['steps']} steps)")
    if all(k in out and out[k]["time_to_target_s"] for k in ("bare", "astraflow")):
        ratio = out["astraflow"]["time_to_target_s"] / out["bare"]["time_to_target_s"]
        console.print(f"  ratio astraflow / bare: {ratio:.2f} (aim: ≤ 1.5)")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
