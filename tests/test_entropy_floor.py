"""`algorithm.entropy_floor`: an entropy bonus that acts only below a floor.

The hinge is decided from the behaviour logprobs (their mean surprisal estimates the
entropy the tokens were drawn from); under it each token adds −coef · H. Checked: the
decision, the gradient against a hand-written one (micro-batches included), and that it
holds entropy up in a GRPO run that collapses it without the floor, while the reward
is still learnt.
"""

from __future__ import annotations

import pytest
import torch

from astraflow.models.factory import tiny_llama
from astraflow.train.batch import Batch
from astraflow.train.loss import LossConfig, entropy_floor_on, policy_loss
from astraflow.train.step import StepSettings, optimize

T = 0.8


def test_the_hinge_reads_the_behaviour_logprobs_mean_surprisal():
    cfg = LossConfig("decoupled", entropy_floor=0.5, entropy_coef=0.1)
    lp = torch.tensor([-0.1, -0.2, -5.0])
    assert entropy_floor_on(cfg, lp, torch.tensor([1.0, 1.0, 0.0]))       # 0.15 < 0.5
    assert not entropy_floor_on(cfg, lp, torch.ones(3))                    # 1.77 ≥ 0.5
    assert not entropy_floor_on(cfg, lp, torch.zeros(3))                   # nothing to learn
    assert not entropy_floor_on(LossConfig("decoupled"), lp, torch.ones(3))  # off
    with pytest.raises(ValueError, match="entropy_floor"):
        LossConfig(entropy_floor=0.0)
    with pytest.raises(ValueError, match="entropy_on needs"):
        policy_loss(lp.clone().requires_grad_(True), lp, torch.ones(3), torch.ones(3), cfg,
                    logp_proximal=lp, entropy_on=True)


def _batch(seed: int, surprisal: float) -> Batch:
    g = torch.Generator().manual_seed(seed)
    prompts = [[1, 5, 6]] * 3 + [[1, 7]] * 3
    comps = [torch.randint(3, 30, (int(torch.randint(2, 6, (1,), generator=g)),),
                           generator=g).tolist() for _ in prompts]
    behaviour = [[-surprisal] * len(c) for c in comps]
    mask = [[1] * len(c) for c in comps]
    adv = torch.randn(len(prompts), generator=g).tolist()
    return Batch.from_rows(prompts, comps, behaviour, mask, adv)


def _by_hand(model: torch.nn.Module, batch: Batch, coef: float) -> list[torch.Tensor]:
    """d/dθ of [Σ −w·A·exp(new − new.detach) − coef·H] / tokens, from the model's logits
    (w: the decoupled objective's behaviour→proximal weight, capped at 2)."""
    model.zero_grad(set_to_none=True)
    pg, ent = [], []
    for p, c in zip(batch.prompts, batch.completions, strict=True):
        ids = torch.tensor([p + c])
        logp = torch.log_softmax(model(input_ids=ids).logits[0, len(p) - 1:-1] / T, dim=-1)
        taken = logp.gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
        pg.append(taken)
        ent.append(-(logp.exp() * logp).sum(-1))
    new, h = torch.cat(pg), torch.cat(ent)
    w = torch.exp(new.detach() - batch.behavior_logprobs).clamp(max=2.0)
    loss = (-(w * batch.advantages * torch.exp(new - new.detach())) - coef * h).sum() / len(new)
    loss.backward()
    return [q.grad.clone() for q in model.parameters()]


@pytest.mark.parametrize("micro", [None, 2])
def test_under_the_floor_the_gradient_is_the_policy_term_minus_coef_times_entropy(micro):
    coef = 0.3
    batch = _batch(1, surprisal=0.2)
    model = tiny_llama(hidden_size=32, layers=2, heads=2, intermediate_size=64, seed=4)
    want = _by_hand(model, batch, coef)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    s = StepSettings(loss=LossConfig("decoupled", entropy_floor=0.5, entropy_coef=coef),
                     temperature=T, micro_batch_rows=micro, chunk_tokens=5, grad_clip=1e9)
    metrics, _ = optimize(model, opt, batch, 0, s)
    got = [q.grad for q in model.parameters()]
    assert max(float((a - b).abs().max()) for a, b in zip(got, want, strict=True)) < 1e-5
    assert metrics["entropy_bonus_frac"] == 1.0
    # above the floor the update is the plain one
    above = _batch(1, surprisal=0.9)
    plain = _by_hand(model, above, 0.0)
    optimize(model, opt, above, 0, s)
    got = [q.grad for q in model.parameters()]
    assert max(float((a - b).abs().max()) for a, b in zip(got, plain, strict=True)) < 1e-5


def _grpo_run(floor: float | None, steps: int = 40) -> tuple[float, float]:
    """A one-token bandit on the tiny model: 4 prompts × 8 samples at T, reward the
    sampled token's id / 31 (the best answer is one token), group-centred
    advantages, Adam. Returns (mean entropy of the last 5 steps' sampling distribution,
    mean reward of the last 5 steps)."""
    model = tiny_llama(hidden_size=32, layers=2, heads=2, intermediate_size=64, seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    s = StepSettings(loss=LossConfig("decoupled", entropy_floor=floor, entropy_coef=0.5),
                     temperature=T, grad_clip=1.0)
    g = torch.Generator().manual_seed(0)
    prompts = [[1, 5 + i] for i in range(4)]
    ents, rewards = [], []
    for _ in range(steps):
        rows_p, rows_c, rows_lp, rows_a = [], [], [], []
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor(prompts)).logits[:, -1] / T, -1)
        ents.append(float(-(logp.exp() * logp).sum(-1).mean()))
        step_r = []
        for i, p in enumerate(prompts):
            toks = torch.multinomial(logp[i].exp(), 8, replacement=True, generator=g)
            r = toks.float() / 31
            step_r.append(float(r.mean()))
            for t, a in zip(toks.tolist(), (r - r.mean()).tolist(), strict=True):
                rows_p.append(p)
                rows_c.append([t])
                rows_lp.append([float(logp[i, t])])
                rows_a.append(a)
        rewards.append(sum(step_r) / len(step_r))
        batch = Batch.from_rows(rows_p, rows_c, rows_lp, [[1]] * len(rows_c), rows_a)
        optimize(model, opt, batch, 0, s)
    return sum(ents[-5:]) / 5, sum(rewards[-5:]) / 5


def test_the_floor_holds_entropy_up_while_the_reward_is_learnt():
    """Without the floor GRPO drives the sampling distribution toward one token (the
    collapse that leaves a group of identical answers with no signal); with it the
    entropy stays near the floor and the reward is learnt just the same. A sign error
    in the bonus (a penalty) would collapse it faster than without."""
    h0 = tiny_llama(hidden_size=32, layers=2, heads=2, intermediate_size=64, seed=0)
    with torch.no_grad():
        lp = torch.log_softmax(h0(input_ids=torch.tensor([[1, 5]])).logits[0, -1] / T, -1)
    start = float(-(lp.exp() * lp).sum())
    floor = 1.0
    h_plain, r_plain = _grpo_run(None)
    h_floor, r_floor = _grpo_run(floor)
    assert start > 2.5                                  # ~log(32) at version 0
    assert h_plain < 0.3 * floor                        # collapsed without it (~0.03)
    assert h_floor > 0.8 * floor                        # held near the floor with it (~1.0)
    assert r_plain > 0.95 and r_floor > 0.9             # both learnt (the best token is 1.0)


def test_the_flow_setting_reaches_the_step():
    from astraflow.config.algorithm import AlgorithmSpec
    from astraflow.train.step import step_settings

    s = step_settings(AlgorithmSpec(entropy_floor=0.3), temperature=0.7, first_update=0)
    assert (s.loss.entropy_floor, s.loss.entropy_coef) == (0.3, 1.0)
    assert step_settings(AlgorithmSpec(), temperature=0.7, first_update=0).loss.entropy_floor is None
    with pytest.raises(ValueError):
        AlgorithmSpec(entropy_floor=-0.1)


def test_a_floor_set_as_a_share_of_version_0_resolves_in_nats():
    from astraflow.config.algorithm import AlgorithmSpec
    from astraflow.train.step import step_settings

    algo = AlgorithmSpec(entropy_floor_of_v0=0.5)
    assert step_settings(algo, temperature=0.7, first_update=0,
                         entropy_floor=0.2).loss.entropy_floor == 0.2
    with pytest.raises(ValueError, match="EntropyFloor"):  # never silently no floor
        step_settings(algo, temperature=0.7, first_update=0)
    with pytest.raises(ValueError, match="not both"):
        AlgorithmSpec(entropy_floor=0.3, entropy_floor_of_v0=0.5)
    with pytest.raises(ValueError):
        AlgorithmSpec(entropy_floor_of_v0=1.5)


def _rows(tag: str, n: int, version: int, logp: list[float], mask: list[int]) -> list[dict]:
    from tests.test_stores import make_rows

    rows = make_rows("solver", n, tag)
    for r in rows:
        r.update(behavior_version=version, behavior_logprobs=logp, loss_mask=mask,
                 completion_ids=[7] * len(logp))
    return rows


def test_version_0s_entropy_is_its_first_batch_in_the_store(tmp_path):
    """The reference is the mean surprisal of the generated tokens (mask 1) of version
    0's first batch in commit order: later version-0 rows and other versions' rows do
    not move it, so a trainer resumed later reads the same floor; until a whole batch
    is there the rows there give it; with none, a clear error."""
    from astraflow.config.algorithm import AlgorithmSpec
    from astraflow.stores import TrajectoryStore
    from astraflow.train.floor import EntropyFloor

    traj = TrajectoryStore(str(tmp_path / "store"))
    floor = EntropyFloor(AlgorithmSpec(entropy_floor_of_v0=0.5), traj, "solver", rows=8)
    traj.table("solver")
    with pytest.raises(RuntimeError, match="no generated token sampled by its version 0"):
        floor.nats()
    # 4 rows: tokens at surprisal 0.2 and 0.6, a tool token (mask 0) at 9.0 not counted
    traj.append("solver", _rows("a", 4, 0, [-0.2, -9.0, -0.6], [1, 0, 1]))
    assert floor.nats() == pytest.approx(0.5 * 0.4)          # provisional: half a batch
    traj.append("solver", _rows("b", 4, 0, [-1.0], [1]))
    traj.append("solver", _rows("c", 8, 0, [-5.0], [1]))      # after the first batch
    traj.append("solver", _rows("d", 8, 1, [-7.0], [1]))      # another version
    whole = 0.5 * (4 * 0.8 + 4 * 1.0) / 12                    # 12 generated tokens
    assert floor.nats() == pytest.approx(whole)
    again = EntropyFloor(AlgorithmSpec(entropy_floor_of_v0=0.5), traj, "solver", rows=8)
    assert again.nats() == pytest.approx(whole)               # a resumed trainer
    fixed = EntropyFloor(AlgorithmSpec(entropy_floor=0.3), traj, "solver", rows=8)
    assert fixed.nats() == 0.3
    assert EntropyFloor(AlgorithmSpec(), traj, "solver", rows=8).nats() is None


def test_a_trainer_step_uses_the_floor_of_its_version_0(tmp_path, tiny_policy_dir):
    """Real trainer steps on the tiny policy: the batch's mean surprisal is 0.3 and
    version 0's is 0.3, so a share of 0.5 sets the floor at 0.15 and the bonus stays
    off; a share that puts the floor above the batch's entropy turns it on. The floor
    in nats is logged (`entropy_floor`)."""
    from astraflow.train.trainer import Trainer
    from tests.runs import seeded_run

    flow = {"name": "f", "policies": [{"name": "solver", "model": {
                "hidden_size": 64, "layers": 2, "heads": 2, "intermediate_size": 128},
                "algorithm": {"lr": 0.01, "objective": "decoupled"}}],
            "env": {"digits": 2, "eval_size": 20},
            "rollout": {"prompts_per_batch": 2, "samples_per_prompt": 4}}
    got = {}
    for share in (0.5, 0.99):
        flow["policies"][0]["algorithm"]["entropy_floor_of_v0"] = share
        ctx = seeded_run(tmp_path / str(share), flow, tiny_policy_dir)
        ctx.trajectories().append("solver", _rows("a", 8, 0, [-0.3, -0.3], [1, 1]))
        ctx.trajectories().append("solver", _rows("b", 8, 0, [-0.2, -0.2], [1, 1]))
        tr = Trainer(ctx)
        first = tr.train_on(tr.poll()).metrics
        # the second batch is less sure (0.2) but the floor stays version 0's first
        second = tr.train_on(tr.poll()).metrics
        got[share] = (first["entropy_floor"], second["entropy_floor"],
                      first["entropy_bonus_frac"], second["entropy_bonus_frac"])
    assert got[0.5] == pytest.approx((0.15, 0.15, 0.0, 0.0))
    assert got[0.99] == pytest.approx((0.297, 0.297, 0.0, 1.0))
