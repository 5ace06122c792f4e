"""A small agent written with the `openai` client and one tool, trained through
AstraFlow's OpenAI-compatible endpoint: nothing in it knows about AstraFlow but the
base URL and one call that reports each episode's reward.

    astraflow run examples/agents/calculator-agent.yaml            # trainer + endpoint
    python examples/agents/calculator_agent.py runs/calculator-agent --minutes 12

The task: "What is 47 * 8?" with a `calculator` tool. An episode is one conversation
(up to 3 model turns); its reward is 1 when the last integer of the final answer is
right. Episodes of one task form a group (GRPO compares them). Held-out tasks (a
tenth of the 720, chosen by a hash) are played greedily (`temperature=0`: served at
the current weights, never recorded) before, during and after training.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from openai import APIConnectionError, OpenAI

from astraflow.rollout.client import episode_url, report_reward

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression of integers "
    "with + - * and parentheses.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}]
SYSTEM = "Answer the question with the number only. You may use the calculator."
# One worked exchange before the question: how a small model learns a tool's call format
# from its prompt (SmolLM2-135M never calls the tool from the system text alone). It is
# prompt, not sampled text, so it is masked out of the loss like the tool's output.
DEMO: list[dict[str, Any]] = [
    {"role": "user", "content": "What is 23 * 4?"},
    {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call_demo", "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "23 * 4"}'}}]},
    {"role": "tool", "tool_call_id": "call_demo", "content": "92"},
    {"role": "assistant", "content": "92"}]
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def tasks(heldout: bool) -> list[dict[str, Any]]:
    """Every task of one split: a two-digit number times a one-digit one."""
    out = []
    for a in range(10, 100):
        for b in range(2, 10):
            if ((a * 31 + b * 17) % 10 == 0) == heldout:
                out.append({"id": f"{a}*{b}", "question": f"What is {a} * {b}?",
                            "answer": a * b})
    return out


def calculator(expression: str) -> str:
    """The tool: integers, + - * and parentheses; anything else is an error message."""
    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError("only integers, + - * and parentheses")
    try:
        return str(ev(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, RecursionError) as err:
        return f"error: {err}"


def play(client: OpenAI, model: str, question: str, *, temperature: float | None = None,
         max_turns: int = 3, max_tokens: int = 48, transcript: list | None = None,
         demo: bool = True) -> str:
    """One episode: the model's turns, each tool call answered, until a plain reply."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      *(DEMO if demo else []),
                                      {"role": "user", "content": question}]
    extra = {} if temperature is None else {"temperature": temperature}
    for _ in range(max_turns):
        msg = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                             max_tokens=max_tokens, **extra).choices[0].message
        if transcript is not None:
            transcript.append(msg)
        if not msg.tool_calls:
            return msg.content or ""
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls:
            try:
                expr = str(json.loads(call.function.arguments).get("expression", ""))
            except (json.JSONDecodeError, AttributeError):
                expr = ""
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": calculator(expr)})
    return ""


def score(text: str, answer: int) -> float:
    nums = re.findall(r"-?\d+", text.replace(",", ""))
    return float(bool(nums) and int(nums[-1]) == answer)


def episode(url: str, model: str, task: dict[str, Any], *, group: str | None = None,
            token: str | None = None, max_tokens: int = 48, demo: bool = True) -> float:
    """Play one recorded episode and report its reward."""
    base, ep = episode_url(url)
    client = OpenAI(base_url=base, api_key=token or "none", max_retries=0, timeout=600)
    reward = score(play(client, model, task["question"], max_tokens=max_tokens, demo=demo),
                   task["answer"])
    report_reward(url, ep, reward, group=group, task=task["id"], token=token)
    return reward


def evaluate(url: str, model: str, items: list[dict[str, Any]], *, token: str | None = None,
             threads: int = 8, max_tokens: int = 48, demo: bool = True) -> float:
    """Greedy held-out success (temperature 0: not recorded)."""
    client = OpenAI(base_url=f"{url}/v1", api_key=token or "none", max_retries=0, timeout=600)

    def one(t: dict[str, Any]) -> float:
        return score(play(client, model, t["question"], temperature=0, max_tokens=max_tokens,
                          demo=demo), t["answer"])

    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(one, items)) / max(len(items), 1)


def train(url: str, model: str, *, minutes: float, group_size: int, groups_at_once: int,
          heldout: list[dict[str, Any]], eval_every_s: float, token: str | None = None,
          seed: int = 0, max_tokens: int = 48, demo: bool = True) -> list[dict[str, Any]]:
    """Play groups of episodes until `minutes` pass, evaluating now and then; the curve."""
    rng, pool = random.Random(seed), tasks(heldout=False)
    def heldout_now() -> float:
        return evaluate(url, model, heldout, token=token, max_tokens=max_tokens, demo=demo)

    curve = [{"t": 0.0, "heldout": heldout_now()}]
    print(json.dumps(curve[-1]), flush=True)
    t0 = last = time.time()
    rewards: list[float] = []
    try:
        with ThreadPoolExecutor(group_size * groups_at_once) as ex:
            while time.time() - t0 < minutes * 60:
                # One group per task draw: its `group_size` episodes are compared together.
                batch = [(rng.choice(pool), f"g{rng.getrandbits(48):x}")
                         for _ in range(groups_at_once)]
                futs = [ex.submit(episode, url, model, t, group=g, token=token,
                                  max_tokens=max_tokens, demo=demo)
                        for t, g in batch for _ in range(group_size)]
                rewards.extend(f.result() for f in futs)
                if time.time() - last >= eval_every_s:
                    curve.append({"t": time.time() - t0,
                                  "train_reward": sum(rewards) / len(rewards),
                                  "heldout": heldout_now()})
                    print(json.dumps(curve[-1]), flush=True)
                    rewards, last = [], time.time()
        curve.append({"t": time.time() - t0, "heldout": heldout_now()})
        print(json.dumps(curve[-1]), flush=True)
    except APIConnectionError:
        # The flow stopped (its stop.max_minutes) first: keep the curve measured so far.
        print(f"the endpoint at {url} went away after {time.time() - t0:.0f}s; "
              "the curve ends at its last held-out check", flush=True)
    return curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="the run folder (its endpoint.json names the URL)")
    ap.add_argument("--model", default="agent", help="the flow's policy name")
    ap.add_argument("--minutes", type=float, default=12.0)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--groups-at-once", type=int, default=4)
    ap.add_argument("--heldout", type=int, default=72, help="held-out tasks evaluated")
    ap.add_argument("--eval-every-s", type=float, default=180.0)
    ap.add_argument("--seed", type=int, default=0, help="seed of the training-task draw")
    ap.add_argument("--max-tokens", type=int, default=48, help="longest model turn")
    ap.add_argument("--token", default=None, help="the endpoint's bearer token, if it has one")
    ap.add_argument("--no-demo", action="store_true",
                    help="no worked tool call before the question (the system text alone)")
    args = ap.parse_args()
    where = args.run / "endpoint.json"
    while not where.is_file():  # the run's launcher starts the endpoint after version 0
        time.sleep(1)
    url = json.loads(where.read_text())["url"]
    curve = train(url, args.model, minutes=args.minutes, group_size=args.group_size,
                  groups_at_once=args.groups_at_once, heldout=tasks(True)[: args.heldout],
                  eval_every_s=args.eval_every_s, token=args.token, max_tokens=args.max_tokens,
                  demo=not args.no_demo, seed=args.seed)
    (args.run / "agent_curve.json").write_text(json.dumps(curve, indent=1))
    print(f"held-out success {curve[0]['heldout']:.1%} -> {curve[-1]['heldout']:.1%}")


if __name__ == "__main__":
    main()
