"""The OpenAI-compatible endpoint (rollout.endpoint) with the real `openai` client, a
real server on 127.0.0.1 and the real trajectory store: exact recording, masking,
stitching, reward timeouts, errors, the bearer token, and the example agent."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from astraflow.models.codec import load_codec
from astraflow.rollout.client import episode_url, report_reward
from astraflow.rollout.serving import Refused, Served
from tests.runs import seeded_run

REPO = Path(__file__).resolve().parents[1]


def endpoint_flow(**endpoint) -> dict:
    return {"name": "ep", "policies": [{"name": "agent", "model": {"kind": "hf", "path": "x"}}],
            "env": {"style": "question", "eval_size": 10},
            "rollout": {"prompts_per_batch": 2, "samples_per_prompt": 2, "temperature": 1.0,
                        "endpoint": {"port": 0, "max_tokens": 24, **endpoint}}}


def make_run(tmp_path, model_dir, **endpoint):
    flow = endpoint_flow(**endpoint)
    flow["policies"][0]["model"]["path"] = str(model_dir)
    return seeded_run(tmp_path / "run", flow, model_dir)


@pytest.fixture
def served(tmp_path, bpe_model_dir):
    s = Served(make_run(tmp_path, bpe_model_dir))
    s.start()
    yield s
    s.stop()


def rows(ctx) -> list[dict]:
    return ctx.trajectories().read_range("agent", 0, 10**9).to_pylist()


def sampled(row: dict) -> list[list[int]]:
    """The row's runs of mask-1 tokens (the model's turns), in order."""
    out, cur = [], []
    for i, m in zip(row["completion_ids"], row["loss_mask"], strict=True):
        if m:
            cur.append(i)
        elif cur:
            out, cur = [*out, cur], []
    return [*out, cur] if cur else out


def wait_for(cond, what: str, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while not (value := cond()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def post(url: str, body, headers: dict | None = None, method: str = "POST"):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data if method == "POST" else None, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_a_tool_episode_is_one_row_tool_and_user_text_masked(served):
    """Two calls, the second extending the first with a tool and a user message: one row
    whose mask-1 tokens are exactly the ids sampled (their logprobs as returned) and whose
    mask-0 tokens are the tool's and the user's text."""
    base, ep = episode_url(served.url)
    client = openai.OpenAI(base_url=base, api_key="none", max_retries=0)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    msgs = [{"role": "user", "content": "What is 12 + 7?"}]
    got, lps = [], []
    for extra in ([{"role": "tool", "tool_call_id": "c1", "content": "TOOLSAYS19"},
                   {"role": "user", "content": "USERSAYSGO"}], None):
        r = client.chat.completions.create(model="agent", messages=msgs, tools=tools,
                                           max_tokens=10, logprobs=True)
        got.append(r.choices[0].message.content or "")
        lps.append([t.logprob for t in r.choices[0].logprobs.content])
        assert r.model_extra["astraflow"]["stitched"] == (extra is None)
        if extra:
            msgs += [r.choices[0].message.model_dump(exclude_none=True), *extra]
    assert report_reward(served.url, ep, 0.5) == {"episode": ep, "rows": 1}
    (row,) = wait_for(lambda: rows(served.ctx), "the row")
    codec = served.codec
    turns = sampled(row)
    assert [codec.decode(t) for t in turns] == got
    flat = [x for row_lp, m in zip(row["behavior_logprobs"], row["loss_mask"], strict=True)
            if m for x in [row_lp]]
    assert flat == pytest.approx([x for t in lps for x in t], abs=1e-5)
    read = [i for i, m in zip(row["completion_ids"], row["loss_mask"], strict=True) if not m]
    text = codec.tokenizer.decode(read)
    assert "TOOLSAYS19" in text and "USERSAYSGO" in text and "<|im_start|>tool" in text
    assert all(lp == 0.0 for lp, m in zip(row["behavior_logprobs"], row["loss_mask"],
                                          strict=True) if not m)
    assert row["reward"] == 0.5 and row["behavior_version"] == 0
    extras = json.loads(row["extras"])
    assert extras["turns"] == 2 and extras["turn_versions"] == [0, 0] and extras["episode"] == ep


def test_a_prompt_that_does_not_extend_starts_a_new_row(served):
    """Edited history (a new system prompt) cannot be stitched: a second row of the same
    episode and group; /v1/completions stitches text that extends the last prompt."""
    base, ep = episode_url(served.url)
    client = openai.OpenAI(base_url=base, api_key="none", max_retries=0)
    msgs = [{"role": "user", "content": "hi"}]
    r1 = client.chat.completions.create(model="agent", messages=msgs, max_tokens=6)
    msgs2 = [{"role": "system", "content": "Be brief."}, *msgs,
             r1.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "?"}]
    r2 = client.chat.completions.create(model="agent", messages=msgs2, max_tokens=6)
    assert not r2.model_extra["astraflow"]["stitched"]
    c1 = client.completions.create(model="agent", prompt="12 plus 7", max_tokens=5)
    c2 = client.completions.create(model="agent", prompt="12 plus 7" + c1.choices[0].text +
                                   " makes", max_tokens=5)
    assert c2.model_extra["astraflow"]["stitched"]
    report_reward(served.url, ep, 1.0)  # no group: the episode is its own, written at once
    got = wait_for(lambda: rows(served.ctx), "the rows")
    assert len(got) == 3 and {r["group_id"] for r in got} == {f"w0-episode-{ep}"}
    by_turns = sorted(json.loads(r["extras"])["turns"] for r in got)
    assert by_turns == [1, 1, 2]
    (text_row,) = [r for r in got if json.loads(r["extras"])["api"] == "completions"]
    codec = served.codec
    assert [codec.decode(t) for t in sampled(text_row)] == [c1.choices[0].text,
                                                             c2.choices[0].text]
    assert codec.tokenizer.decode([i for i, m in zip(text_row["completion_ids"],
                                                     text_row["loss_mask"], strict=True)
                                   if not m]) == " makes"


def test_groups_wait_for_their_episodes_and_the_trainer_trains_on_them(served):
    """A group (samples_per_prompt = 2 episodes) is written once both are rewarded; the
    trainer steps on the rows and the audit finds every row accounted for."""
    from astraflow.observe.audit import audit
    from astraflow.train.trainer import Trainer

    eps = []
    for _ in range(4):
        base, ep = episode_url(served.url)
        openai.OpenAI(base_url=base, api_key="none", max_retries=0).chat.completions.create(
            model="agent", messages=[{"role": "user", "content": "12 + 7"}], max_tokens=4)
        eps.append(ep)
    report_reward(served.url, eps[0], 1.0, group="a")
    served.flush()
    assert rows(served.ctx) == []  # group a has 1 of its 2 episodes
    report_reward(served.url, eps[1], 0.0, group="a")
    report_reward(served.url, eps[2], 1.0, group="b")
    report_reward(served.url, eps[3], 0.0, group="b")
    wait_for(lambda: len(rows(served.ctx)) == 4, "4 rows")
    assert Trainer(served.ctx, "agent").run(max_steps=1) == 1
    (pa,) = audit(served.ctx)
    assert pa.ok, pa


def test_an_episode_without_a_reward_is_dropped_and_counted(tmp_path, bpe_model_dir):
    s = Served(make_run(tmp_path, bpe_model_dir, reward_timeout_s=0.3))
    s.start()
    try:
        base, ep = episode_url(s.url)
        openai.OpenAI(base_url=base, api_key="none", max_retries=0).chat.completions.create(
            model="agent", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        wait_for(lambda: post(f"{s.url}/health", None, method="GET")[1]["episodes_dropped"] == 1,
                 "the drop")
        status, body = post(f"{s.url}/episodes/{ep}/reward", {"reward": 1.0})
        assert status == 404 and body["error"]["code"] == "episode_not_found"
        metrics = wait_for(lambda: [r for r in s.ctx.ledger().read_metrics().to_pylist()
                                    if r["name"] == "episodes_dropped"], "the metric")
        assert sum(r["value"] for r in metrics) == 1
    finally:
        s.stop()
    assert rows(s.ctx) == []


def test_malformed_requests_get_openai_errors(served):
    url = served.url
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    msgs = [{"role": "user", "content": "hi"}]
    cases = [
        (dict(model="nope", messages=msgs), openai.NotFoundError, "model", "model_not_found"),
        (dict(model="agent", messages=[]), openai.BadRequestError, "messages", None),
        (dict(model="agent", messages=msgs, temperature=0.3), openai.BadRequestError,
         "temperature", None),
        (dict(model="agent", messages=msgs, n=2), openai.BadRequestError, "n", None),
        (dict(model="agent", messages=msgs, max_tokens=10**6), openai.BadRequestError,
         "max_tokens", None),
        (dict(model="agent", messages=[{"role": "wizard", "content": "x"}]),
         openai.BadRequestError, "messages[0].role", None),
    ]
    for kwargs, kind, param, code in cases:
        with pytest.raises(kind) as err:
            client.chat.completions.create(**kwargs)
        e = err.value.body
        assert set(e) == {"message", "type", "param", "code"}, e
        assert e["type"] == "invalid_request_error" and e["param"] == param
        assert e["code"] == code and e["message"]
    assert post(f"{url}/v1/chat/completions", b"{not json")[0] == 400
    assert post(f"{url}/v1/nowhere", {})[1]["error"]["code"] == "not_found"
    assert post(f"{url}/v1/chat/completions", None, method="GET")[0] == 405
    assert post(f"{url}/episodes/x/reward", {"reward": "high"})[1]["error"]["param"] == "reward"
    greedy = client.chat.completions.create(model="agent", messages=msgs, temperature=0,
                                            max_tokens=3)
    assert greedy.model_extra["astraflow"]["recorded"] is False  # evaluation: not a row
    r = client.chat.completions.create(model="agent", messages=msgs, max_tokens=3)
    ep = r.model_extra["astraflow"]["episode"]
    assert post(f"{url}/episodes/{ep}/reward", {"reward": 1})[0] == 200
    status, body = post(f"{url}/episodes/{ep}/reward", {"reward": 1})
    assert status == 409 and body["error"]["code"] == "episode_ended"
    with pytest.raises(openai.ConflictError):  # an ended episode takes no more calls
        client.chat.completions.create(model="agent", messages=msgs, max_tokens=3,
                                       extra_headers={"X-Episode-Id": ep})
    status, body = post(f"{url}/v1/completions", {"model": "agent", "prompt": [10**9]})
    assert status == 400 and body["error"]["param"] == "prompt"


def test_other_addresses_need_a_bearer_token(tmp_path, bpe_model_dir, monkeypatch):
    monkeypatch.delenv("ASTRAFLOW_ENDPOINT_TOKEN", raising=False)
    with pytest.raises(Refused, match="bearer token"):
        Served(make_run(tmp_path / "a", bpe_model_dir, host="0.0.0.0"))
    monkeypatch.setenv("ASTRAFLOW_ENDPOINT_TOKEN", "s3cret")
    s = Served(make_run(tmp_path / "b", bpe_model_dir))
    s.start()
    try:
        msgs = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.AuthenticationError) as err:
            openai.OpenAI(base_url=f"{s.url}/v1", api_key="wrong", max_retries=0
                          ).chat.completions.create(model="agent", messages=msgs)
        assert err.value.body["code"] == "invalid_api_key"
        assert post(f"{s.url}/health", None, method="GET")[0] == 401
        r = openai.OpenAI(base_url=f"{s.url}/v1", api_key="s3cret", max_retries=0
                          ).chat.completions.create(model="agent", messages=msgs, max_tokens=2)
        assert r.choices[0].finish_reason in ("stop", "length")
    finally:
        s.stop()


def load_example():
    spec = importlib.util.spec_from_file_location(
        "calculator_agent", REPO / "examples" / "agents" / "calculator_agent.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow  # a worker process to start (torch, transformers): ~35 s on 2 busy cores
def test_the_example_agent_trains_through_the_worker_process(tmp_path, bpe_model_dir):
    """`astraflow rollout` of an endpoint flow, stopped by pid: the example agent's episodes
    (the real client, its tool loop) become rows whose sampled ids decode to exactly the
    text the agent received, written on SIGTERM at the latest."""
    agent = load_example()
    assert agent.calculator("12*(3+4)") == "84" and agent.score("It is 84.", 84) == 1.0
    ctx = make_run(tmp_path, bpe_model_dir, max_tokens=48)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("ASTRAFLOW_ENDPOINT_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "astraflow", "rollout", str(ctx.run_dir)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        where = ctx.run_dir / "endpoint.json"
        wait_for(lambda: where.is_file() or proc.poll() is not None, "endpoint.json", 120)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        url = json.loads(where.read_text())["url"]
        transcripts = []
        for task in agent.tasks(heldout=False)[:2]:
            base, ep = episode_url(url)
            client = openai.OpenAI(base_url=base, api_key="none", max_retries=0)
            seen: list = []
            text = agent.play(client, "agent", task["question"], max_tokens=12, transcript=seen)
            report_reward(url, ep, agent.score(text, task["answer"]), group="both")
            transcripts.append((ep, seen))
        assert agent.evaluate(url, "agent", agent.tasks(heldout=True)[:2], threads=2,
                              max_tokens=12) in (
            0.0, 0.5, 1.0)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    assert not (ctx.run_dir / "endpoint.json").exists()
    codec = load_codec(bpe_model_dir)
    got = {json.loads(r["extras"])["episode"]: r for r in rows(ctx)}
    assert len(got) == 2
    for ep, seen in transcripts:
        row = got[ep]
        received = [(m.content or "") + "".join(
            f'<tool_call>{{"name": "{c.function.name}", "arguments": {c.function.arguments}}}'
            f'</tool_call>' for c in m.tool_calls or []) for m in seen]
        assert [codec.decode(t) for t in sampled(row)] == received


def test_tool_calls_are_read_from_the_hermes_form_and_matched_back():
    """What a model turn's text becomes (content, tool_calls), and that the reply an agent
    sends back (ids and key order changed, content None) is recognised for stitching."""
    from astraflow.rollout.chat import call_text, parse_calls, same_reply

    tools = [{"type": "function", "function": {"name": "calculator"}}]
    text = 'Let me see. <tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}' \
           '</tool_call>'
    content, calls = parse_calls(text, tools)
    assert content == "Let me see. " and len(calls) == 1
    assert calls[0]["function"] == {"name": "calculator", "arguments": '{"expression": "6*7"}'}
    assert call_text(calls) == text[len(content):]  # renders back as the model wrote it
    for bad in ('<tool_call>{"name": "rm", "arguments": {}}</tool_call>',  # not offered
                "<tool_call>{not json}</tool_call>", "no call at all"):
        assert parse_calls(bad, tools) == (bad, [])
    assert parse_calls(text, []) == (text, [])  # no tools offered: plain content
    reply = {"role": "assistant", "content": None, "tool_calls": calls}
    sent = {"role": "assistant", "content": "", "refusal": None, "tool_calls": [
        {"id": "other", "type": "function", "function": {
            "arguments": '{ "expression":"6*7" }', "name": "calculator"}}]}
    assert same_reply(sent, reply)
    sent["tool_calls"][0]["function"]["arguments"] = '{"expression": "6*8"}'
    assert not same_reply(sent, reply)


def test_an_endpoint_flow_is_one_async_worker():
    from astraflow.config.loader import FlowError, parse_flow

    flow = endpoint_flow()
    parse_flow(flow)
    with pytest.raises(FlowError, match="rollout.workers: 1"):
        parse_flow({**flow, "rollout": {**flow["rollout"], "workers": 2}})
    with pytest.raises(FlowError, match="mode: async"):
        parse_flow({**flow, "mode": "sync"})
