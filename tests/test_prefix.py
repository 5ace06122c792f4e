"""The shared-prompt pass (astraflow.train.prefix): rows of one GRPO group run their
prompt once, and the logprobs and gradients are the plain pass's."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

from astraflow.models.factory import tiny_llama
from astraflow.train import logprobs as lp_mod
from astraflow.train.logprobs import completion_logprobs, completion_logprobs_reference
from astraflow.train.prefix import shared_prompts

# Three prompts of different lengths, their rows interleaved, completions of 0-6 tokens.
P1, P2, P3 = [1, 5, 6, 7], [1, 8], [1, 9, 9, 10, 11, 4]
PROMPTS = [P1, P2, P1, P3, P2, P1, P3, P1]
COMPS = [[12, 13, 14], [15, 16, 17, 18, 2], [2], [20, 21, 22, 23, 24, 25], [], [3, 4],
         [26], [27, 28, 29, 30]]


def _grads(model: torch.nn.Module, out: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    params = [p for p in model.parameters() if p.requires_grad]
    return list(torch.autograd.grad((out * w).sum(), params, allow_unused=True))


def _models() -> list[tuple[str, torch.nn.Module]]:
    torch.manual_seed(0)
    qwen = Qwen2ForCausalLM(Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=2,
                                        num_key_value_heads=1, max_position_embeddings=64))
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=40, n_embd=32, n_layer=2, n_head=2,
                                      n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0))
    return [("llama", tiny_llama(hidden_size=64, layers=2, heads=2, intermediate_size=128,
                                 seed=0)), ("qwen2", qwen), ("gpt2", gpt2)]


def test_shared_prompts_index_rows_in_first_seen_order():
    distinct, index = shared_prompts(PROMPTS)
    assert distinct == [P1, P2, P3]
    assert index == [0, 1, 0, 2, 1, 0, 2, 0]


@pytest.mark.parametrize("name,model", _models(), ids=lambda x: x if isinstance(x, str) else "")
def test_shared_prompt_pass_equals_the_reference_in_values_and_gradients(name, model):
    """Whatever the architecture: the shared-prompt pass where it fits, the plain pass
    where it does not; the numbers are the full-vocabulary reference's either way."""
    model.train()
    ref = completion_logprobs_reference(model, PROMPTS, COMPS, 0, temperature=0.7)
    w = torch.linspace(-1.0, 1.0, ref.numel())
    g_ref = _grads(model, ref, w)
    out = completion_logprobs(model, PROMPTS, COMPS, 0, temperature=0.7, chunk_tokens=4,
                              entropy=True)
    assert out.logprobs.shape == ref.shape == (sum(map(len, COMPS)),)
    assert (out.logprobs - ref).abs().max() < 1e-5
    g_new = _grads(model, out.logprobs, w)
    for a, b in zip(g_ref, g_new, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert float((a - b).abs().max()) < 1e-5
    # every architecture here takes the shared pass (the check would refuse one that differs)
    assert lp_mod._PREFIX.get(model) is True


def test_shared_prompt_pass_runs_each_prompt_once():
    """The point of it: the backbone sees each distinct prompt's tokens once."""
    model = _models()[0][1].train()
    seen: list[tuple[int, ...]] = []
    backbone = model.get_decoder()
    hook = backbone.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    try:
        completion_logprobs(model, PROMPTS, COMPS, 0)  # the check runs once, first
        seen.clear()
        completion_logprobs(model, PROMPTS, COMPS, 0)
    finally:
        hook.remove()
    # one pass over the 3 distinct prompts (6 wide), one over the 8 rows' completions
    assert seen == [(3, 6), (8, 5)]


# The same rows behind a 9-token opening every prompt shares (a chat template's system
# prompt): the opening runs once for all of them.
OPENING = [1, 10, 11, 12, 13, 14, 15, 16, 17]
OPENED = [OPENING + p[1:] + [19] for p in PROMPTS]


@pytest.mark.parametrize("name,model", _models(), ids=lambda x: x if isinstance(x, str) else "")
def test_a_shared_opening_runs_once_with_the_reference_values_and_gradients(name, model):
    model.train()
    ref = completion_logprobs_reference(model, OPENED, COMPS, 0, temperature=0.7)
    w = torch.linspace(-1.0, 1.0, ref.numel())
    g_ref = _grads(model, ref, w)
    seen: list[tuple[int, ...]] = []
    hook = model.get_decoder().register_forward_pre_hook(
        lambda _m, a, kw: seen.append(tuple((kw.get("input_ids", a[0] if a else None)).shape)),
        with_kwargs=True)
    try:
        completion_logprobs(model, OPENED, COMPS, 0, temperature=0.7)  # the check, once
        seen.clear()
        out = completion_logprobs(model, OPENED, COMPS, 0, temperature=0.7).logprobs
    finally:
        hook.remove()
    assert lp_mod._PREFIX.get(model) is True
    # the opening (9), the 3 distinct prompts' rest (6 wide with the shared last token),
    # the 8 rows' completions
    assert seen == [(1, 9), (3, 6), (8, 5)]
    assert (out - ref).abs().max() < 1e-5
    for a, b in zip(g_ref, _grads(model, out, w), strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert float((a - b).abs().max()) < 1e-5


def test_an_architecture_the_shared_pass_does_not_fit_keeps_the_plain_pass(monkeypatch, caplog):
    """Checked once per model: a mismatch (here a forged one) means the plain pass for
    that model, said in a warning, and the same numbers."""
    model = _models()[0][1].train()
    real = lp_mod.prefix_hidden

    def off_by_a_bit(*a, **kw):
        h, t = real(*a, **kw)
        return h + 0.5, t

    monkeypatch.setattr(lp_mod, "prefix_hidden", off_by_a_bit)
    with caplog.at_level(logging.WARNING, logger="astraflow.train.logprobs"):
        out = completion_logprobs(model, PROMPTS, COMPS, 0).logprobs
        completion_logprobs(model, PROMPTS, COMPS, 0)
    assert lp_mod._PREFIX[model] is False
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "shared-prompt pass does not fit" in caplog.records[0].message
    ref = completion_logprobs_reference(model, PROMPTS, COMPS, 0)
    assert (out - ref).abs().max() < 1e-5


def test_gradient_checkpointing_keeps_the_plain_pass():
    """A checkpointed model keeps no KV cache while it trains: the plain pass runs, with
    the reference's numbers."""
    model = _models()[0][1].train()
    model.gradient_checkpointing_enable()
    ref = completion_logprobs_reference(model, PROMPTS, COMPS, 0)
    out = completion_logprobs(model, PROMPTS, COMPS, 0).logprobs
    assert (out - ref).abs().max() < 1e-5
    out.sum().backward()
    assert model.model.embed_tokens.weight.grad is not None
