"""Multi-turn tool-using episodes (`tool_agent`), the env registry and the search workload.

The actor tests drive `ToolAgent.play` with a scripted "model" (a function of the
episode's text so far) over the ascii character codec, so what the actor does with
turns, tool calls and limits is checked exactly, without sampling noise. Ordering is
shown by events, never by wall-clock thresholds: a slow tool is blocked on an Event
that only the *other* episodes' later calls release.
"""

from __future__ import annotations

import json
import random
import threading
from collections import Counter

import pytest

from astraflow import registry
from astraflow.config.loader import parse_flow
from astraflow.envs import build_env
from astraflow.envs.base import Limits, Task, ToolResult
from astraflow.envs.search import RELATIONS, SearchEnv
from astraflow.models.tokenizer import CharCodec
from astraflow.rollout.generation import Generation
from astraflow.workflows.tool_agent import ToolAgent
from astraflow.workflows.workload import make_env, make_workflow

CODEC = CharCodec.default("ascii")
RELATIONS_TEXT = {r: fact for r, (_, fact) in RELATIONS.items()}


# -- a small env defined here (also used through `module:attr`) --------------------
class FnTool:
    def __init__(self, name, fn, timeout_s=30.0):
        self.name, self.fn, self.timeout_s = name, fn, timeout_s
        self.description = name

    def __call__(self, task, argument):
        return self.fn(task, argument)


class EchoEnv:
    """Tasks `t0`, `t1`, …; tools given per test; answer `ok`."""

    name = "echo"

    def __init__(self, tools=(), max_turns: int = 4, max_context_tokens: int | None = None,
                 episode_timeout_s: float | None = None):
        self.tools = {t.name: t for t in tools}
        self.limits = Limits(max_turns, max_context_tokens, episode_timeout_s)

    def sample(self, rng):
        return Task(f"t{rng.randrange(100)}", "Q?", "ok")

    def eval_tasks(self, n):
        return [Task(f"e{i}", "Q?", "ok") for i in range(n)]

    def instructions(self):
        return ""

    def reward(self, task, answer):
        return float(answer == task.answer)

    def demonstration(self, task, rng):
        from astraflow.envs.base import DemoTurn

        return [DemoTurn("model", "<call>echo hi</call>"), DemoTurn("tool", "hi"),
                DemoTurn("model", "<answer>ok</answer>")]


def scripted(script):
    """A generate function: `script(task_id_text, context_text)` → the turn's text."""
    calls = []

    def generate(prompts, samples, max_new):
        comps, lps, why = [], [], []
        for p in prompts:
            for _ in range(samples):
                text = script(CODEC.decode(p))
                ids = CODEC.encode(text)[1:][:max_new]
                comps.append(ids)
                lps.append([-0.5] * len(ids))
                why.append("stop" if len(ids) == len(CODEC.encode(text)) - 1 else "length")
        calls.append(len(comps))
        return Generation(comps, lps, why)

    generate.calls = calls
    return generate


def agent(env, **kw):
    return ToolAgent(env, CODEC, samples_per_prompt=1, **kw)


def tasks(*ids):
    return [Task(i, f"{i}?", "ok") for i in ids]


def test_a_slow_tool_delays_only_its_own_episode():
    release = threading.Event()
    order: list[str] = []

    def wait_tool(task, arg):
        if task.task_id == "slow":
            released = release.wait(timeout=20)  # safety only: the fast episodes release it
            order.append("slow returns")
            return ToolResult("released" if released else "never released")
        order.append(f"{task.task_id} waits")
        return ToolResult("fast")

    def release_tool(task, arg):
        order.append(f"{task.task_id} releases")
        if sum(o.endswith("releases") for o in order) == 2:
            release.set()
        return ToolResult("done")

    env = EchoEnv([FnTool("wait", wait_tool), FnTool("release", release_tool)])

    def script(text):
        if "<tool>" not in text:
            return "<call>wait x</call>"
        if text.startswith("slow") or "<tool>done</tool>" in text:
            return "<answer>ok</answer>"
        return "<call>release x</call>"

    eps = agent(env).play(tasks("slow", "a", "b"), 1, scripted(script), 40)
    slow, a, b = eps
    # The fast episodes made their second call while the slow tool was still running:
    # had the actor waited for every call of the batch, the slow one would never return
    # "released" (it waits for calls the others could only make after it).
    assert order.index("a releases") < order.index("slow returns")
    assert order.index("b releases") < order.index("slow returns")
    assert [e.finish for e in eps] == ["answer"] * 3
    assert slow.tool_errors == 0 and "released" in CODEC.decode(slow.context())
    assert (slow.turns, slow.tool_calls) == (2, 1) and (a.turns, a.tool_calls) == (3, 2)
    assert a.events == ["turn", "call:wait", "result", "turn", "call:release", "result", "turn"]


def test_tool_output_is_read_not_trained_and_rows_record_the_episode():
    env = EchoEnv([FnTool("echo", lambda t, a: ToolResult(a.upper()))])
    wf = agent(env)

    class Actor:
        codec = CODEC
        gen = staticmethod(scripted(lambda text: "<answer>ok</answer>" if "<tool>" in text
                                    else "<call>echo hello</call>"))

        def generate(self, role, prompts, *, samples, max_new_tokens, stop=()):
            assert set(stop) == {"</call>", "</answer>"}
            return self.gen(prompts, samples, max_new_tokens)

    wf.k = 2
    parts = wf.episodes(tasks("q1"), Actor())
    assert len(parts) == 2 and {p.group for p in parts} == {"t0"}
    p = parts[0]
    text = "".join(CODEC.decode([i]) for i in p.completion_ids)
    assert text == "<call>echo hello</call><tool>HELLO</tool><answer>ok</answer>"
    read = "".join(CODEC.decode([i])
                   for i, m in zip(p.completion_ids, p.loss_mask, strict=True) if m == 0)
    assert read == "<tool>HELLO</tool>"
    assert all(lp == 0.0 for lp, m in zip(p.logprobs, p.loss_mask, strict=True) if m == 0)
    assert all(lp == -0.5 for lp, m in zip(p.logprobs, p.loss_mask, strict=True) if m == 1)
    assert p.reward == 1.0 and p.finish_reason == "answer"
    assert p.extras["turns"] == 2 and p.extras["tool_calls"] == 1 and p.extras["tool_errors"] == 0


def test_an_env_with_reward_episode_grades_the_calls_too():
    """`reward_episode` sees the episode's calls in order: here the answer pays only
    after an `echo` call whose argument is `proof`, so two episodes with the same answer
    score differently, and a group agreeing on answer and calls is graded once."""
    graded: list[tuple] = []

    class Grounded(EchoEnv):
        def reward_episode(self, task, answer, calls):
            graded.append((task.task_id, answer, calls))
            return float(answer == "ok" and any(c.tool == "echo" and c.argument == "proof"
                                                for c in calls))

    env = Grounded([FnTool("echo", lambda t, a: ToolResult(a))])
    wf = agent(env)

    def script(text):
        if "<tool>" in text or text.startswith("guess"):
            return "<answer>ok</answer>"
        return "<call>echo proof</call>" if text.startswith("proved") else "<call>echo x</call>"

    class Actor:
        codec = CODEC
        gen = staticmethod(scripted(script))

        def generate(self, role, prompts, *, samples, max_new_tokens, stop=()):
            return self.gen(prompts, samples, max_new_tokens)

    wf.k = 2
    parts = wf.episodes(tasks("proved", "other", "guess"), Actor())
    assert [p.reward for p in parts] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert sorted((g[0], [(c.tool, c.argument) for c in g[2]]) for g in graded) == [
        ("guess", []), ("other", [("echo", "x")]), ("proved", [("echo", "proof")])]


def test_finish_reasons_and_tool_errors_are_recorded():
    hang = threading.Event()

    def boom(task, arg):
        raise RuntimeError("tool bug")

    def hangs(task, arg):
        hang.wait(timeout=20)
        return ToolResult("late")

    env = EchoEnv([FnTool("echo", lambda t, a: ToolResult(a)), FnTool("boom", boom),
                   FnTool("hang", hangs), FnTool("slowcall", hangs, timeout_s=0.2)],
                  max_turns=3)
    try:
        def script(text):
            q = text.split("?")[0]
            n = text.count("<tool>")
            return {"loop": "<call>echo again</call>",
                    "bad": "<call>nosuch x</call>" if n == 0 else
                           "<call>boom x</call>" if n == 1 else "<answer>no</answer>",
                    "mute": "I do not know",
                    "long": "x" * 50,
                    "tmo": "<call>slowcall x</call>" if n == 0 else "<answer>ok</answer>"}[q]

        eps = agent(env).play(tasks("loop", "bad", "mute", "long", "tmo"), 1, scripted(script), 30)
        got = {e.task.task_id: e for e in eps}
        assert got["loop"].finish == "max_turns" and got["loop"].turns == 3
        assert got["bad"].finish == "answer" and got["bad"].tool_errors == 2
        assert "unknown tool 'nosuch'" in CODEC.decode(got["bad"].context())
        assert "RuntimeError: tool bug" in CODEC.decode(got["bad"].context())
        assert got["mute"].finish == "no_action" and got["long"].finish == "length"
        # a call past its tool's timeout is an error the model reads; the episode goes on
        assert got["tmo"].finish == "answer" and got["tmo"].tool_errors == 1
        assert "no result within" in CODEC.decode(got["tmo"].context())

        ctx_env = EchoEnv([FnTool("echo", lambda t, a: ToolResult("y" * 40))], max_turns=9,
                          max_context_tokens=60)
        (e,) = agent(ctx_env).play(tasks("c"), 1, scripted(lambda t: "<call>echo a</call>"), 30)
        assert e.finish == "context" and len(e.context()) <= 60

        to_env = EchoEnv([FnTool("hang", hangs)], episode_timeout_s=0.3)
        (e,) = agent(to_env).play(tasks("h"), 1, scripted(lambda t: "<call>hang x</call>"), 30)
        assert e.finish == "timeout" and e.tool_errors == 1
    finally:
        hang.set()


def test_held_out_scores_ignore_the_episode_wall_clock():
    """A score depends on the weights alone: the same greedy episodes that a rollout
    ends at `episode_timeout_s` (a batch's clock, not the episode's own) score in full
    when held out. The tool sleeps 0.2 s, four times the 0.05 s limit, so no timing luck
    is involved either way."""
    import time

    def slow(task, arg):
        time.sleep(0.2)
        return ToolResult("ok")

    env = EchoEnv([FnTool("slow", slow)], episode_timeout_s=0.05)

    def script(text):
        return "<call>slow x</call>" if "<tool>" not in text else "<answer>ok</answer>"

    class ScriptedEngine:
        codec = CODEC

        def generate(self, prompts, *, stop=(), max_new_tokens, samples_per_prompt, greedy):
            return scripted(script)(prompts, samples_per_prompt, max_new_tokens)

    wf = agent(env)
    (e,) = wf.play(tasks("r"), 1, scripted(script), 30)
    assert e.finish == "timeout"
    items = wf.items("agent", tasks("h1", "h2"), random.Random(0))
    assert wf.score("agent", ScriptedEngine(), items) == 1.0
    assert [e.finish for e in wf.last_episodes] == ["answer", "answer"]


def test_rewards_grade_each_distinct_answer_once_and_concurrently():
    """A group's samples often agree; each (task, answer) is graded once, and grading
    runs on the pool: two slow graders meet at a barrier neither passes alone."""
    meet = threading.Barrier(2, timeout=30)
    graded: list[tuple[str, str | None]] = []

    class SlowGrader(EchoEnv):
        def reward(self, task, answer):
            graded.append((task.task_id, answer))
            if answer == "slow":
                meet.wait()  # raises BrokenBarrierError if the other never arrives
            return super().reward(task, answer)

    a, b = tasks("a", "b")
    scores = agent(SlowGrader()).rewards(
        [(a, "ok"), (a, "ok"), (b, "ok"), (a, "slow"), (b, "slow"), (a, None)])
    assert scores == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert Counter(graded) == Counter([("a", "ok"), ("b", "ok"), ("a", "slow"), ("b", "slow"),
                                       ("a", None)])


def test_env_resolution_by_name_and_module_attr(tmp_path):
    assert registry.resolve("env", "search") is SearchEnv
    flow = parse_flow({"name": "e", "policies": [{"name": "p", "model": {"alphabet": "ascii"}}],
                       "env": {"name": "tests.test_tool_agent:EchoEnv",
                               "params": {"max_turns": 2}}})
    assert flow.workflow.name == "tool_agent"  # the default for envs other than math
    env = make_env(flow)
    assert isinstance(env, EchoEnv) and env.limits.max_turns == 2
    wf = make_workflow(flow, CODEC)
    assert isinstance(wf, ToolAgent) and wf.limits.max_turns == 2
    with pytest.raises(ValueError, match="unknown env 'nope'"):
        parse_flow({"name": "e", "policies": [{"name": "p"}], "env": {"name": "nope"}})
    with pytest.raises(ValueError, match="does not import"):
        build_env("tests.no_such_module:Env", {})
    with pytest.raises(ValueError, match="has no 'Missing'"):
        build_env("tests.test_tool_agent:Missing", {})
    # math keeps its fields and its workflow
    math = parse_flow({"name": "m", "policies": [{"name": "p"}], "env": {"digits": 2}})
    assert math.workflow.name == "single" and make_env(math).digits == 2


def test_search_env_index_tool_reward_and_heldout_split():
    env = SearchEnv(seed=3, entities=60, top_k=2)
    rng = random.Random(0)
    train = {env.sample(rng).task_id for _ in range(2000)}
    held = env.eval_tasks(20)
    assert len({t.task_id for t in held}) == 20 and all(env.is_heldout(t) for t in held)
    assert not train & {t.task_id for t in held}
    assert [t.task_id for t in SearchEnv(seed=3, entities=60).eval_tasks(20)] == \
        [t.task_id for t in held]  # the same in every process
    t = held[0]
    out = env.tools["search"](t, f"{t.data['relation']} {t.data['entity']}")
    assert out.error is None and t.answer in out.output.split("\n")[0]
    assert len(out.output.split("\n")) == 2
    assert env.tools["search"](t, "?!").error == "empty_query"
    assert env.reward(t, f" {t.answer.lower()} ") == 1.0 and env.reward(t, "Zzz") == 0.0
    assert env.reward(t, None) == 0.0
    demo = env.demonstration(t, rng)
    assert [d.who for d in demo] == ["model", "tool", "model"] and t.answer in demo[1].text

    wf = ToolAgent(env, CODEC, samples_per_prompt=2)
    d = wf.demo("agent", random.Random(1))
    seq = "".join(CODEC.decode([i]) for i in d.target_ids)
    own = "".join(CODEC.decode([i]) for i, m in zip(d.target_ids, d.target_mask, strict=True) if m)
    assert seq.startswith("<call>search ") and "<tool>" in seq and seq.endswith("</answer>")
    assert "<tool>" not in own and own.startswith("<call>search ")


def test_search_value_pool_draws_values_from_few_names_and_keeps_the_unique_corpus():
    from astraflow.envs.search import make_corpus

    pooled = make_corpus(5, 60, value_pool=7)
    for rel in ("capital", "river", "leader"):
        values = [f.value for f in pooled if f.relation == rel]
        assert len(values) == 60 and 4 <= len(set(values)) <= 7  # drawn, not all the same
    names = {f.entity for f in pooled} | {f.value for f in pooled}
    assert len({f.entity for f in pooled}) == 60 and len(names) <= 60 + 21
    unique = make_corpus(5, 60)
    assert len({f.value for f in unique}) == 180  # the default: every value a fresh name
    assert make_corpus(5, 60) == unique and make_corpus(5, 60, value_pool=7) == pooled
    with pytest.raises(ValueError, match="value_pool"):
        make_corpus(5, 60, value_pool=-1)
    env = SearchEnv(seed=5, entities=60, value_pool=7, top_k=1)
    t = env.eval_tasks(5)[0]
    hit = env.tools["search"](t, f"{t.data['relation']} {t.data['entity']}")
    assert hit.output == f"{RELATIONS_TEXT[t.data['relation']].format(e=t.data['entity'], v=t.answer)}"


def test_search_worlds_give_one_question_several_answers_and_search_sees_its_own():
    from astraflow.envs.search import make_corpus

    env = SearchEnv(seed=2, entities=10, value_pool=20, worlds=4, top_k=3)
    assert len(env.facts) == 4 * 10 * 3 and len({f.entity for f in env.facts}) == 10
    tasks = [env._task(t) for t in env._ids]
    by_q: dict[str, set[str]] = {}
    for t in tasks:
        by_q.setdefault(t.prompt, set()).add(t.answer)
    assert len(by_q) == 30 and sum(len(a) > 1 for a in by_q.values()) >= 25  # not memorisable
    for t in tasks[:12]:  # a search sees only the task's own edition
        out = env.tools["search"](t, f"{t.data['relation']} {t.data['entity']}").output
        assert out.split("\n")[0].endswith(f" is {t.answer}.")
        others = {f.text for f in env.facts if f.world != t.data["world"]} - \
            {f.text for f in env.facts if f.world == t.data["world"]}
        assert not set(out.split("\n")) & others
    assert make_corpus(2, 10, 20, 1) == make_corpus(2, 10, 20)  # one world: as before
    with pytest.raises(ValueError, match="worlds"):
        make_corpus(2, 10, 20, 0)


@pytest.fixture
def search_policy_dir(tmp_path):
    """A tiny ascii model warm-started on search demonstrations until its greedy play
    calls the tool on most validation tasks (a random model almost never writes
    `<call>`). Warm start runs in rounds with a check between them, so the fixture does
    not rest on one fixed step count being enough on every machine's float order."""
    import torch

    from astraflow.config.model import WarmStartSpec
    from astraflow.models.factory import save_policy, tiny_llama
    from astraflow.models.tokenizer import build_char_tokenizer
    from astraflow.rollout.engine import HFEngine
    from astraflow.train.warm_start import warm_start

    torch.manual_seed(0)
    model = tiny_llama(hidden_size=64, layers=2, heads=2, intermediate_size=128,
                       alphabet="ascii", max_positions=256)
    wf = ToolAgent(SearchEnv(entities=60, top_k=1), CODEC, samples_per_prompt=2)
    val = wf.validation_items("agent", random.Random(7), 10)
    calling = 0.0
    for round_ in range(6):
        warm_start(model, CODEC, wf, "agent", WarmStartSpec(
            max_steps=40, batch_size=16, lr=0.01, target_accuracy=1.0, check_every=1000,
            check_size=10), seed=round_)
        wf.score("agent", HFEngine(model, CODEC), val)
        calling = sum(e.tool_calls > 0 for e in wf.last_episodes) / len(val)
        if calling >= 0.9:
            break
    assert calling >= 0.9, f"warm start left greedy tool calling at {calling:.0%}"
    d = tmp_path / "search-policy"
    d.mkdir()
    save_policy(model, build_char_tokenizer("ascii"), d)
    return d


@pytest.mark.slow  # the fixture's warm start: ~25 s quiet, ~90 s on the loaded 2 cores
def test_search_flow_through_worker_and_trainer(tmp_path, search_policy_dir):
    from astraflow.rollout.worker import RolloutWorker
    from astraflow.train.trainer import Trainer
    from tests.runs import seeded_run

    ctx = seeded_run(tmp_path / "run", {
        "name": "s", "policies": [{"name": "agent", "model": {
            "hidden_size": 64, "layers": 2, "heads": 2, "intermediate_size": 128,
            "alphabet": "ascii", "max_positions": 256}}],
        "env": {"name": "search", "params": {"entities": 60, "top_k": 1,
                                             "max_context_tokens": 256}, "eval_size": 10},
        # a low temperature: the worker samples near the greedy play the fixture checked
        "rollout": {"prompts_per_batch": 3, "samples_per_prompt": 2, "max_new_tokens": 40,
                    "temperature": 0.3},
        # no zero-variance filter: a barely warmed model may score 0 on every episode
        "stages": [{"name": "group_advantages"}],
    }, search_policy_dir)
    w = RolloutWorker(ctx, "wA")
    assert w.refresh_weights()
    assert w.produce_batch() == 6
    rows = ctx.trajectories().read_range("agent", 0, 10**9).to_pylist()
    extras = [json.loads(r["extras"]) for r in rows]
    assert all({"turns", "tool_calls", "tool_errors", "tool_s", "episode_s", "finish_reason"} <= set(x)
               for x in extras)
    assert sum(x["tool_calls"] for x in extras) >= 1, Counter(x["finish_reason"] for x in extras)
    assert all(r["env"] == "search" for r in rows)
    called = next(r for r, x in zip(rows, extras, strict=True) if x["tool_calls"])
    read = list(called["loss_mask"])
    assert 0 in read and read[0] == 1  # the model's call, then the tool's output (mask 0)
    tr = Trainer(ctx)
    sl = tr.poll()
    assert sl is not None and sl.num_rows == 6
    res = tr.train_on(sl)
    assert tr.version == 1 and ctx.weights().latest("agent") == 1
    assert res.metrics["tokens"] == sum(sum(r["loss_mask"]) for r in rows)


def test_turn_stop_strings_on_the_hf_engine_and_cut_after_the_fact_elsewhere():
    import torch

    from astraflow.models.factory import tiny_llama
    from astraflow.rollout.engine import HFEngine
    from astraflow.rollout.generation import generate_with_stops

    torch.manual_seed(0)
    codec = CharCodec.default()
    eng = HFEngine(tiny_llama(hidden_size=64, layers=2, heads=2, intermediate_size=128), codec)
    stop = ("12", "7")
    out = generate_with_stops(eng, [codec.encode("3+4=")] * 2, stop, max_new_tokens=30,
                              samples_per_prompt=16, generator=torch.Generator().manual_seed(1))
    hit = 0
    for comp, lps, why in zip(out.completions, out.logprobs, out.finish_reasons, strict=True):
        text = "".join(codec.decode([i]) for i in comp)
        assert len(lps) == len(comp)
        if any(s in text for s in stop):  # ends right at the first stop string
            hit += 1
            assert why == "stop" and any(text.endswith(s) for s in stop)
            assert not any(s in text[:-1] for s in stop)
    assert hit >= 4  # a random model writes a 7 within 30 characters often enough

    class NoStopEngine:  # an engine that cannot stop at strings (as vllm): cut afterwards
        codec = CODEC

        def generate(self, prompts, **kw):
            ids = CODEC.encode("<call>search x</call>junk")[1:]
            return Generation([list(ids)], [[-1.0] * len(ids)], ["length"])

    out = generate_with_stops(NoStopEngine(), [[1]], ("</call>", "</answer>"), max_new_tokens=9)
    assert CODEC.decode(out.completions[0]) == "<call>search x</call>"
    assert out.finish_reasons == ["stop"] and len(out.logprobs[0]) == len(out.completions[0])


def test_chat_models_read_tool_output_as_a_templated_message(smollm2_dir):
    from astraflow.models.codec import load_codec

    codec = load_codec(smollm2_dir)
    ids = codec.encode_tool_turn("The capital of Ab is Cd.")
    assert codec.tokenizer.decode(ids) == ("<|im_end|>\n<|im_start|>user\n<tool>The capital of "
                                           "Ab is Cd.</tool><|im_end|>\n<|im_start|>assistant\n")
    wf = ToolAgent(SearchEnv(entities=30, top_k=1), codec, samples_per_prompt=2)
    d = wf.demo("agent", random.Random(0))
    prompt = codec.tokenizer.decode(d.prompt_ids)
    assert "<call>search ARG</call>" in prompt and prompt.endswith("<|im_start|>assistant\n")
    own = codec.tokenizer.decode([i for i, m in zip(d.target_ids, d.target_mask, strict=True) if m])
    read = codec.tokenizer.decode([i for i, m in zip(d.target_ids, d.target_mask, strict=True)
                                   if not m])
    assert own.startswith("<call>search ") and own.endswith("</answer>") and "<tool>" not in own
    assert read.startswith("<|im_end|>") and "<tool>The " in read
