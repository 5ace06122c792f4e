"""The tool-using example flows fit their own demonstrations.

A flow whose `max_new_tokens` is shorter than a demonstrated turn, or whose context
limit is shorter than a demonstrated episode, warm-starts on episodes its workers can
never play (the turn is cut at `length`, the episode at `context`) and never learns,
however long it runs. So for each example, on its own codec: every demonstrated model
turn fits `rollout.max_new_tokens`, every episode fits the context limit (and the tiny
model's `max_positions`), the prompt fits `rollout.max_prompt_tokens`, and the
demonstrated answer, replayed through the env, earns reward 1 (for code, graded in
the real sandbox).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from astraflow.config.loader import load_flow
from astraflow.envs.base import Answer, parse_action
from astraflow.models.codec import load_codec
from astraflow.models.tokenizer import CharCodec
from astraflow.workflows.workload import make_workflow

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TINY = ["search.yaml", "code.yaml", "sql.yaml"]
SMOLLM2 = ["smollm2-search.yaml", "smollm2-code.yaml", "smollm2-sql.yaml"]


def _model_turns(target: list[int], mask: list[int]) -> list[list[int]]:
    """The demo's model turns: its runs of trained (mask 1) tokens."""
    turns: list[list[int]] = []
    prev = 0
    for tok, m in zip(target, mask, strict=True):
        if m and not prev:
            turns.append([])
        if m:
            turns[-1].append(tok)
        prev = m
    return turns


def _check_fits(name: str, codec, demos: int) -> None:
    flow = load_flow(EXAMPLES / name)
    wf = make_workflow(flow, codec)
    mnt = wf.max_new_tokens("agent")
    limit = wf.limits.max_context_tokens
    assert limit is not None, f"{name}: a tool flow needs a context limit"
    if flow.policy.model.kind == "tiny":
        limit = min(limit, flow.policy.model.max_positions)
    calls = 0
    for i in range(demos):
        demo = wf.demo("agent", random.Random(i))
        task = wf.env.sample(random.Random(i))  # the task demo() drew from the same seed
        turns = _model_turns(demo.target_ids, demo.target_mask)
        calls += len(turns) - 1
        assert max(map(len, turns)) <= mnt, f"{name}: a demonstrated turn exceeds max_new_tokens"
        assert len(demo.prompt_ids) + len(demo.target_ids) < limit, f"{name}: demo {i} too long"
        if flow.rollout.max_prompt_tokens is not None:
            assert len(demo.prompt_ids) <= flow.rollout.max_prompt_tokens
        action = parse_action(codec.decode(turns[-1]))
        assert isinstance(action, Answer), f"{name}: demo {i} does not end in an answer"
        assert wf.env.reward(task, action.text) == 1.0, f"{name}: demo {i}: {action.text!r}"
    assert calls >= demos // 4, f"{name}: only {calls} tool calls in {demos} demonstrations"


@pytest.mark.parametrize("name", TINY)
def test_tiny_examples_fit_their_demonstrations(name):
    alphabet = load_flow(EXAMPLES / name).policy.model.alphabet
    _check_fits(name, CharCodec.default(alphabet), 16)


@pytest.mark.parametrize("name", SMOLLM2)
def test_smollm2_examples_fit_their_demonstrations(name, smollm2_dir):
    _check_fits(name, load_codec(smollm2_dir), 8)
