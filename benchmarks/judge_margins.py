"""How sure a `judge` verifier is of each held-out verdict, and what a small bias does.

    python benchmarks/judge_margins.py [--flow examples/smollm2-solver-verifier.yaml]
                                       [--model DIR | --run runs/X --version N] [--n 100]
                                       [--out margins.json]

The verifier's held-out figure is greedy judgement accuracy on balanced right answers
and near misses. Greedy hides how the verdict was reached: a verifier that judges and
one whose every verdict is a near tie can score the same. This plays each held-out
item greedily (as `Workflow.score` does), finds the step where the reply's verdict
word begins, and reads the margin there: log p(" correct") − log p(" incorrect"),
the first token of each. It prints per kind of answer (right, near miss) the greedy
accept share and mean margin, how many verdicts are within 0.1 nats of a tie, and the
greedy accuracy the same verifier would have if every margin moved by δ nats: what one
small update that shifts the verdict's prior, and nothing else, does to the held-out
figure. SmolLM2-135M's version 0 on the solver-verifier example is the case that
needed it (docs/benchmarks/multi-policy-smollm2.md, "Version 0's verdicts are ties").
The margin is between the two words the verifier's message asks for, read at the step
where the reply's first verdict word ends; a reply that judges another way ("Yes, …",
"not correct") gets those two words' margin at that step, which then says less.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SHIFTS = (-0.3, -0.2, -0.1, -0.05, 0.0, 0.05, 0.1, 0.2, 0.3)
TIE = 0.1


@dataclass
class Verdict:
    """One held-out item: whether its answer is right, the greedy reply, the margin at
    the verdict word (None when the reply has no verdict word), and whether the
    reply passes the item's check."""

    right: bool
    reply: str
    margin: float | None
    passed: bool


def summarise(verdicts: list[Verdict], shifts: tuple[float, ...] = SHIFTS) -> dict:
    """Accept shares and mean margins per kind of answer, near ties, and the accuracy
    under each shift δ of every margin (a verdict with no margin keeps its greedy
    outcome: a shift of the verdict's prior does not give it a verdict word)."""
    out: dict = {"items": len(verdicts),
                 "accuracy": sum(v.passed for v in verdicts) / max(len(verdicts), 1)}
    for kind, want in (("right", True), ("near_miss", False)):
        ms = [v.margin for v in verdicts if v.right == want and v.margin is not None]
        out[kind] = {"items": sum(v.right == want for v in verdicts),
                     "accept_share": sum(m > 0 for m in ms) / max(len(ms), 1),
                     "mean_margin": statistics.fmean(ms) if ms else None}
    known = [v.margin for v in verdicts if v.margin is not None]
    out["no_verdict"] = len(verdicts) - len(known)
    out["ties"] = sum(abs(m) < TIE for m in known)
    out["median_abs_margin"] = statistics.median(abs(m) for m in known) if known else None
    out["accuracy_if_shifted"] = {
        f"{d:+.2f}": sum(((v.margin + d > 0) == v.right) if v.margin is not None else v.passed
                         for v in verdicts) / max(len(verdicts), 1)
        for d in shifts}
    return out


def first_token(codec, text: str) -> int:
    return codec.encode(text)[0]


def play(model, codec, workflow, items, max_new_tokens: int) -> list[Verdict]:
    """Each item greedily, one at a time (the margin needs the scores of its own steps)."""
    from astraflow.workflows.judge import verdict

    yes, no = first_token(codec, " correct"), first_token(codec, " incorrect")
    out = []
    for item in items:
        prompt = workflow.encode_prompt(item.prompt)
        with torch.no_grad():
            res = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens,
                                 do_sample=False, output_scores=True,
                                 return_dict_in_generate=True)
        gen = res.sequences[0, len(prompt):].tolist()
        reply = codec.decode(gen)
        margin = None
        for step, scores in enumerate(res.scores):
            if verdict(codec.decode(gen[: step + 1])) is not None:
                logp = torch.log_softmax(scores[0].float(), -1)
                margin = float(logp[yes] - logp[no])
                break
        right = bool(item.check("correct"))  # the item wants an accept: its answer is right
        out.append(Verdict(right, reply, margin, bool(item.check(reply))))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flow", default=str(ROOT / "examples/smollm2-solver-verifier.yaml"))
    ap.add_argument("--model", help="an HF model or version folder (default: the verifier's "
                    "model.path)")
    ap.add_argument("--run", help="a run folder, with --version: a published version "
                    "(full weights or an adapter)")
    ap.add_argument("--version", type=int)
    ap.add_argument("--policy", default="verifier")
    ap.add_argument("--n", type=int, default=None, help="held-out items (default: eval_size)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (one: a niced run beside a training run stays fast)")
    ap.add_argument("--out", help="write the summary and every verdict here (JSON)")
    args = ap.parse_args(argv)

    from astraflow.config.loader import load_flow
    from astraflow.context import RunContext
    from astraflow.rollout.engine import HFEngine
    from astraflow.workflows.judge import Judge
    from astraflow.workflows.workload import make_workflow

    torch.set_num_threads(args.threads)
    if args.run:
        if args.version is None:
            ap.error("--run needs --version")
        ctx = RunContext.open(args.run)
        flow, path = ctx.flow, Path(ctx.weights().load(args.policy, args.version))
    else:
        flow = load_flow(args.flow)
        path = Path(args.model or flow.policy_spec(args.policy).model.path)
    if not path.is_dir():
        ap.error(f"{path}: no such model or version folder")
    # As the held-out evaluator loads a version (an adapter version: its base, merged).
    engine = HFEngine.from_dir(path, dtype=flow.policy_spec(args.policy).model.dtype)
    workflow = make_workflow(flow, engine.codec)
    if not isinstance(workflow, Judge) or workflow.blind:
        ap.error(f"flow {flow.name}: the margin is read on a one-turn `judge` verifier "
                 f"(workflow.name: judge, not blind)")
    role = flow.role_of(args.policy)
    items = workflow.eval_items(role, args.n or flow.env.eval_size)
    verdicts = play(engine.model.eval(), engine.codec, workflow, items,
                    workflow.max_new_tokens(role))
    summary = summarise(verdicts)
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"model": str(path), "summary": summary,
             "verdicts": [asdict(v) for v in verdicts]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
