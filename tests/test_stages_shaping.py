"""Dr. GRPO, length normalisation, over-length penalty, solved-task filter, and the
accounting of replayed rows: exact values on small hand-built tables."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
import torch

from astraflow import registry
from astraflow.data.stages import REPLAYED, StageContext, StageResult, drop_rows, run_stages
from astraflow.train.batch import Batch
from astraflow.train.loss import LossConfig, policy_loss
from astraflow.train.step import StepSettings, optimize

CTX = StageContext(policy="p", version=10, step=3)


def table(groups, rewards, masks=None, reasons=None, replayed=None):
    masks = masks or [[1, 1]] * len(rewards)
    cols = {"group_id": groups, "reward": pa.array(rewards, pa.float32()),
            "behavior_version": pa.array([10] * len(rewards), pa.int64()),
            "loss_mask": pa.array(masks, pa.list_(pa.int8()))}
    if reasons is not None:
        cols["extras"] = [json.dumps({"finish_reason": r}) for r in reasons]
    if replayed is not None:
        cols[REPLAYED] = pa.array(replayed, pa.bool_())
    return pa.table(cols)


def col(res: StageResult, name: str) -> np.ndarray:
    return np.asarray(res.rows.column(name).to_pylist(), dtype=np.float64)


# ------------------------------------------------------------------ Dr. GRPO
def test_dr_grpo_advantages_keep_the_reward_scale_and_sum_to_zero_per_group():
    groups = ["a", "a", "a", "a", "b", "b"]
    t = table(groups, [1, 0, 0, 0, 0.1, 0])
    adv = col(registry.resolve("stage", "dr_grpo_advantages")(t, CTX), "advantage")
    np.testing.assert_allclose(adv, [0.75, -0.25, -0.25, -0.25, 0.05, -0.05], atol=1e-6)
    for g in ("a", "b"):
        assert abs(adv[[i for i, x in enumerate(groups) if x == g]].sum()) < 1e-6
    # GRPO blows the near-constant group b up to ±1 (std normalisation); Dr. GRPO does not,
    # and scaling every reward scales every advantage.
    grpo = col(registry.resolve("stage", "group_advantages")(t, CTX), "advantage")
    assert grpo[4] == pytest.approx(1.0, abs=1e-3)
    scaled = col(registry.resolve("stage", "dr_grpo_advantages")(table(groups, [10, 0, 0, 0, 1, 0]), CTX),
                 "advantage")
    np.testing.assert_allclose(scaled, 10 * adv, atol=1e-5)


# ------------------------------------------------------------------ length normalisation
def test_length_norm_writes_the_row_weights_and_composes():
    t = table(["a", "a", "a"], [1, 0, 0], masks=[[1, 1, 1, 1], [0, 1, 0], [0, 0]])
    stage = registry.resolve("stage", "length_norm")
    assert col(stage(t, CTX), "loss_weight").tolist() == [1, 1, 1]
    seq = stage(t, CTX, mode="sequence_mean")
    assert col(seq, "loss_weight").tolist() == [0.25, 1.0, 0.0]
    assert seq.dropped == {} and seq.rows.num_rows == 3
    again = stage(seq.rows.set_column(seq.rows.column_names.index("loss_weight"), "loss_weight",
                                      pa.array([2.0, 3.0, 5.0], pa.float32())), CTX,
                  mode="sequence_mean")
    assert col(again, "loss_weight").tolist() == [0.5, 3.0, 0.0]  # multiplied
    with pytest.raises(ValueError, match="sequence_mean"):
        stage(t, CTX, mode="per_row")


def test_sequence_mean_weighs_every_answer_alike_token_mean_every_token():
    """A 1-token answer with advantage +1 against a 4-token one with −1, at ratio 1:
    the token mean lets the long wrong answer dominate; the sequence mean is the
    mean of the two rows' own means. Checked on the loss value and on the gradient
    each token receives."""
    adv = torch.tensor([1.0, -1, -1, -1, -1])
    mask = torch.ones(5)
    beh = torch.full((5,), -1.0)
    cfg = LossConfig()
    grads = {}
    for mode, w in {"token_mean": None, "sequence_mean": torch.tensor([1, .25, .25, .25, .25])}.items():
        new = beh.clone().requires_grad_(True)
        loss, stats = policy_loss(new, beh, adv, mask, cfg, logp_proximal=new.detach(),
                                  token_weights=w)
        loss.backward()
        grads[mode] = new.grad.tolist()
        assert stats.tokens == 5
        assert float(loss.detach()) == pytest.approx({"token_mean": 0.6, "sequence_mean": 0.0}[mode])
    np.testing.assert_allclose(grads["token_mean"], [-0.2, 0.2, 0.2, 0.2, 0.2], atol=1e-6)
    np.testing.assert_allclose(grads["sequence_mean"], [-0.5, 0.125, 0.125, 0.125, 0.125], atol=1e-6)


def _tiny():
    from astraflow.models.factory import tiny_llama

    torch.manual_seed(0)
    return tiny_llama(hidden_size=32, layers=1, heads=2, intermediate_size=64)


def test_weighted_loss_is_exact_under_micro_batches():
    """optimize's normaliser is the weighted token count of the whole update, so
    sequence-mean weights give the same step one-shot and in 1-row micro-batches;
    all-ones weights give exactly the unweighted step."""
    prompts = [[1, 2], [3, 4], [5, 6]]
    comps = [[7], [8, 9, 10, 11], [12, 13]]
    beh = [[-3.0] * len(c) for c in comps]
    masks = [[1] * len(c) for c in comps]
    advs = [1.0, -1.0, 0.5]

    def step(weights, micro):
        model = _tiny()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        batch = Batch.from_rows(prompts, comps, beh, masks, advs, loss_weight=weights)
        optimize(model, opt, batch, 0, StepSettings(micro_batch_rows=micro, grad_clip=1e9))
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    seq = [1.0, 0.25, 0.5]
    plain, seq_once = step(None, None), step(seq, None)
    torch.testing.assert_close(seq_once, step(seq, 1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(plain, step([1.0, 1.0, 1.0], 1), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(plain, seq_once)


# ------------------------------------------------------------------ over-length penalty
def test_overlength_penalty_by_finish_reason():
    t = table(["a", "a", "a"], [1, 0, 1], reasons=["length", "length", "stop"])
    res = registry.resolve("stage", "overlength_penalty")(t, CTX, penalty=0.5)
    assert col(res, "reward").tolist() == [0.5, -0.5, 1.0]
    assert res.metrics == {"rows_overlong": 2.0, "overlength_penalty_mean": pytest.approx(-1 / 3)}
    no_reason = t.set_column(t.column_names.index("extras"), "extras", pa.array(["{}"] * 3))
    with pytest.raises(ValueError, match="no finish_reason"):
        registry.resolve("stage", "overlength_penalty")(no_reason, CTX)


def test_overlength_penalty_soft_by_length():
    """DAPO's soft punishment: L=4, B=2 → 0 up to 2 tokens, −0.5 at 3, −1 at 4, −1 beyond;
    only tokens the policy wrote (loss mask 1) count."""
    masks = [[1, 1], [1, 1, 1], [1, 1, 1, 1], [1] * 5, [1, 1, 0, 0, 0, 0]]
    t = table(["a"] * 5, [1, 1, 1, 1, 1], masks=masks)
    res = registry.resolve("stage", "overlength_penalty")(t, CTX, penalty=2.0, max_tokens=4, buffer_tokens=2)
    assert col(res, "reward").tolist() == [1.0, 0.0, -1.0, -1.0, 1.0]
    hard = registry.resolve("stage", "overlength_penalty")(t, CTX, max_tokens=4)
    assert col(hard, "reward").tolist() == [1, 1, 1, 0, 1]


# ------------------------------------------------------------------ solved-task filter
def test_solved_filter_drops_solved_groups_and_counts_them():
    t = table(["a", "a", "b", "b", "c", "c", "d", "d", "d", "d"], [1, 1, 1, 0, 0, 0, 1, 1, 1, 0])
    res = registry.resolve("stage", "solved_filter")(t, CTX)
    assert res.rows.column("group_id").to_pylist() == ["b", "b", "c", "c"] + ["d"] * 4
    assert res.dropped == {"solved": 2} and res.metrics == {"groups_solved": 1.0}
    res = registry.resolve("stage", "solved_filter")(t, CTX, max_rate=0.75, min_rate=0.0)
    assert res.rows.column("group_id").to_pylist() == ["b", "b"]
    assert res.dropped == {"solved": 6, "unsolved": 2}
    chained = run_stages(t, CTX, [("solved_filter", {"min_rate": 0.0})])
    assert chained.ledger_counts() == (6, 0, 4)
    assert chained.metrics["rows_dropped_solved"] == 2 and chained.metrics["rows_dropped_unsolved"] == 2


# ------------------------------------------------------------------ replayed rows' accounting
def test_filters_after_replay_count_replayed_drops_apart():
    """Rows marked replayed are not this step's: a filter that drops them reports them
    under `replayed`, and the ledger counts only consumed rows."""
    t = table(["a", "a", "a", "b", "b"], [0, 0, 1, 1, 1], replayed=[False, False, True, False, True])
    res = run_stages(t, CTX, [("zero_variance_filter", {}), ("group_advantages", {})])
    assert res.dropped == {"zero_variance": 1, "replayed": 1}
    assert res.ledger_counts() == (2, 0, 1)  # 3 consumed rows: 2 used, 1 filtered
    assert res.metrics["rows_dropped_replayed"] == 1


def _drops_replayed_as_own(rows, ctx):
    return StageResult(rows.filter(pa.array([not r for r in rows.column(REPLAYED).to_pylist()])),
                       {"mine": int(sum(rows.column(REPLAYED).to_pylist()))})


def _adds_unmarked(rows, ctx):
    return StageResult(pa.concat_tables([rows, rows.slice(0, 1)]), added=1)


def test_a_stage_that_miscounts_replayed_rows_is_refused(monkeypatch):
    for name in ("_drops_replayed_as_own", "_adds_unmarked"):
        monkeypatch.setitem(registry.KINDS["stage"].builtins, name[1:],
                            f"tests.test_stages_shaping:{name}")
    t = table(["a", "a"], [0, 1], replayed=[False, True])
    with pytest.raises(RuntimeError, match="use stages.drop_rows"):
        run_stages(t, CTX, [("drops_replayed_as_own", {})])
    with pytest.raises(RuntimeError, match="account for every row"):
        run_stages(t, CTX, [("adds_unmarked", {})])
    ok = drop_rows(t, {"mine": [False, True]})
    assert ok.dropped == {"mine": 0, "replayed": 1}


def test_a_misspelt_stage_param_fails_when_the_flow_is_read():
    from astraflow.config.loader import FlowError, parse_flow

    flow = {"name": "x", "policies": [{"name": "solver"}]}
    with pytest.raises(FlowError, match=r"stages\.1: .*length_norm.*'mdoe'"):
        parse_flow({**flow, "stages": [{"name": "group_advantages"},
                                       {"name": "length_norm", "params": {"mdoe": "x"}}]})
    ok = parse_flow({**flow, "stages": [{"name": "replay", "params": {"ratio": 0.5}}]})
    assert ok.stages[0].params == {"ratio": 0.5}
