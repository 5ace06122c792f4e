"""Tiny policy, tokenizer, engine and the math workload."""

from __future__ import annotations

import random

import torch

from astraflow.envs.math import MathEnv
from astraflow.models.tokenizer import CharCodec, build_char_tokenizer
from astraflow.rollout.engine import HFEngine


def test_codec_agrees_with_hf_tokenizer(tiny_policy_dir):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tiny_policy_dir))
    codec = CharCodec.from_pretrained(tiny_policy_dir)
    for text in ["042+917=", "1-2=", "3*(4)=", "Y", "N?"]:
        assert codec.encode(text) == hf(text)["input_ids"]
    assert codec.decode(codec.encode("042+917=")[1:] + [codec.eos_id, 5]) == "042+917="
    assert len(build_char_tokenizer().get_vocab()) == 32


def test_shared_prefix_sampling_equals_repeated_prompts(tiny_policy_dir):
    eng = HFEngine.from_dir(tiny_policy_dir)
    prompts = [eng.codec.encode("12+34="), eng.codec.encode("5+6=")]
    a = eng.generate(prompts, samples_per_prompt=3, max_new_tokens=5, greedy=True)
    b = eng.generate([p for p in prompts for _ in range(3)], max_new_tokens=5, greedy=True)
    assert a.completions == b.completions
    assert all(len(c) == len(lp) for c, lp in zip(a.completions, a.logprobs, strict=True))


def _whole_and_shared(eng, prompts, monkeypatch, **kw):
    """The same generation with the shared opening run once, and with every prompt run
    whole (the sharing turned off by an unreachable threshold)."""
    from astraflow.rollout import engine as engine_mod

    shared = eng.generate(prompts, **kw, generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(engine_mod, "MIN_SHARED_PREFIX", 10**9)
    whole = eng.generate(prompts, **kw, generator=torch.Generator().manual_seed(1))
    return shared, whole


def test_prompts_that_open_alike_share_one_prefill(tiny_policy_dir, monkeypatch):
    from astraflow.models.hf import MIN_SHARED_PREFIX, common_prefix

    eng = HFEngine.from_dir(tiny_policy_dir)
    opening = "1+2=3;4+5=9;7-1=6;"
    prompts = [eng.codec.encode(opening + q) for q in ("12+34=", "5+6=", "300-2=", "9*9=")]
    assert common_prefix(prompts) >= MIN_SHARED_PREFIX
    for kw in ({"greedy": True}, {"samples_per_prompt": 3, "temperature": 1.0}):
        shared, whole = _whole_and_shared(eng, prompts, monkeypatch, max_new_tokens=6, **kw)
        monkeypatch.undo()
        assert shared.completions == whole.completions
        for a, b in zip(shared.logprobs, whole.logprobs, strict=True):
            assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-4)
    # A prompt that is the whole opening keeps its last token to run on the opening.
    short = [eng.codec.encode(opening), eng.codec.encode(opening + "1+1=")]
    shared, whole = _whole_and_shared(eng, short, monkeypatch, max_new_tokens=4, greedy=True)
    assert shared.completions == whole.completions


def test_chat_template_prompts_share_their_system_prompt(smollm2_dir, monkeypatch):
    """SmolLM2's chat template opens every question with the same ~25-token system
    prompt: sharing it leaves greedy answers and their logprobs as they were."""
    from astraflow.models.hf import common_prefix

    eng = HFEngine.from_dir(smollm2_dir)
    prompts = [eng.codec.encode_chat([{"role": "user", "content": f"What is {a} plus {b}?"}])
               for a, b in ((12, 7), (45, 3), (90, 9), (33, 1))]
    assert common_prefix(prompts) >= 20
    shared, whole = _whole_and_shared(eng, prompts, monkeypatch, max_new_tokens=8, greedy=True)
    assert shared.completions == whole.completions
    for a, b in zip(shared.logprobs, whole.logprobs, strict=True):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-3)


def test_sampling_logprobs_are_log_probabilities(tiny_policy_dir):
    eng = HFEngine.from_dir(tiny_policy_dir)
    g = eng.generate([eng.codec.encode("1+1=")], samples_per_prompt=64, max_new_tokens=1,
                     generator=torch.Generator().manual_seed(0))
    lps = [lp[0] for lp in g.logprobs]
    assert all(lp <= 0 for lp in lps)
    # The model's probability of each sampled first token, by a separate forward pass.
    with torch.no_grad():
        logits = eng.model(input_ids=torch.tensor([eng.codec.encode("1+1=")])).logits[0, -1]
    ref = torch.log_softmax(logits, -1)
    for comp, lp in zip(g.completions, lps, strict=True):
        assert abs(ref[comp[0]].item() - lp) < 1e-4


def test_math_heldout_disjoint_and_reward_parses():
    env = MathEnv(digits=3)
    held = env.eval_tasks(500)
    assert len({t.task_id for t in held}) == 500 and all(env.is_heldout(t) for t in held)
    rng = random.Random(0)
    train = [env.sample(rng) for _ in range(5000)]
    assert not {t.task_id for t in train} & {t.task_id for t in held}
    t = held[0]
    assert env.reward(t, t.answer) == 1.0
    assert env.reward(t, " " + t.answer + " ") == 1.0
    assert env.reward(t, t.answer + "1") == 0.0
    assert env.reward(t, "") == 0.0 and env.reward(t, "12+") == 0.0
    assert env.eval_tasks(500) == held  # the same set in every process


def test_weights_round_trip_through_the_store(tmp_path, tiny_policy_dir):
    """A published version loads into a running engine in place and changes its output."""
    import shutil

    from astraflow.models.factory import save_policy
    from astraflow.models.hf import load_policy
    from astraflow.stores import WeightStore

    ws = WeightStore(tmp_path / "w")
    st = ws.staging_dir("p")
    for f in tiny_policy_dir.iterdir():
        shutil.copy(f, st)
    ws.publish("p", st, step=0)
    eng = HFEngine.from_dir(ws.load("p", 0))
    model = load_policy(ws.load("p", 0))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    st = ws.staging_dir("p")
    save_policy(model, None, st)
    ws.publish("p", st, step=1)
    prompts = [eng.codec.encode(f"{i}+{i}=") for i in range(20)]
    before = eng.generate(prompts, max_new_tokens=4, greedy=True).completions
    eng.load_weights(ws.load("p", 1))
    after = eng.generate(prompts, max_new_tokens=4, greedy=True).completions
    ref = HFEngine(model.eval(), eng.codec).generate(prompts, max_new_tokens=4, greedy=True).completions
    assert after == ref and after != before
