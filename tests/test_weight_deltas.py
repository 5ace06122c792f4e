"""Weight versions published as deltas, on real torch weights and a real store.

A tiny Llama takes real AdamW steps; each step is saved in HF format and published
with `delta_chain`. Every version rebuilt by a reader that holds nothing must be
byte-identical to what the trainer saved; a worker that holds a version fetches only
the deltas after it; a tampered or missing delta is refused; pruning keeps chains;
a SIGKILL between a delta's payload and its manifest leaves no visible version.
"""

from __future__ import annotations

import hashlib
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from astraflow.stores import TamperedWeights, WeightStore
from astraflow.stores.deltas import SUFFIX
from tests.test_mirror import servers, two_stores  # noqa: F401 (fixtures)

CHAIN = 3


class Steps:
    """A tiny model that takes one real optimizer step per `stage`, saved in HF format."""

    def __init__(self, lr: float = 1e-3):
        from astraflow.models.factory import tiny_llama
        from astraflow.models.tokenizer import build_char_tokenizer

        torch.manual_seed(0)
        self.model = tiny_llama(hidden_size=64, layers=2, heads=2, intermediate_size=128)
        self.tok = build_char_tokenizer()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=(0.9, 0.99))

    def stage(self, ws: WeightStore, *, step: bool = True) -> tuple[Path, str]:
        """Stage the model (after one step); returns the folder and its weights' sha256."""
        from astraflow.models.factory import save_policy

        if step:
            ids = torch.randint(0, self.model.config.vocab_size, (4, 12))
            self.model(input_ids=ids, labels=ids).loss.backward()
            self.opt.step()
            self.opt.zero_grad()
        d = ws.staging_dir("solver")
        save_policy(self.model, self.tok, d)
        return d, sha(d / "model.safetensors")


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def publish_steps(ws: WeightStore, n: int, *, chain: int = CHAIN) -> list[str]:
    """Versions 0..n-1 (v0 whole, then one step each); returns their weights' sha256."""
    steps, digests = Steps(), []
    for i in range(n):
        d, h = steps.stage(ws, step=i > 0)
        assert ws.publish("solver", d, step=i, delta_chain=chain) == i
        digests.append(h)
    return digests


def reader(ws: WeightStore) -> WeightStore:
    """Another process's view of the same root, holding nothing rebuilt yet."""
    shutil.rmtree(Path(ws.root) / ".rebuilt", ignore_errors=True)
    return WeightStore(ws.root)


def test_chain_of_deltas_then_a_snapshot_rebuilds_exactly(tmp_path):
    ws = WeightStore(tmp_path / "weights")
    digests = publish_steps(ws, 7)
    mans = [ws.manifest("solver", v) for v in range(7)]
    assert [m.delta and m.delta["depth"] for m in mans] == [None, 1, 2, 3, None, 1, 2]
    assert [m.delta and m.delta["base"] for m in mans] == [None, 0, 0, 0, None, 4, 4]
    assert [m.delta and m.delta["parent"] for m in mans] == [None, 0, 1, 2, None, 4, 5]
    for m in mans[1:4] + mans[5:]:
        assert "model.safetensors" + SUFFIX in m.files and "model.safetensors" not in m.files
        assert m.total_bytes < 0.9 * mans[0].total_bytes  # fp32 AdamW steps: ~0.7x measured
        assert m.served["model.safetensors"]["sha256"] == digests[m.version]
    r = reader(ws)
    for v in range(7):
        path = r.load("solver", v)
        assert sha(path / "model.safetensors") == digests[v], v
        assert sorted(p.name for p in path.iterdir() if p.name != "MANIFEST.json") == sorted(
            mans[v].served)
    # the rebuilt folder is what an engine loads: same tensors as the trainer's model
    from astraflow.models.hf import load_policy

    model = load_policy(r.load("solver", 6))
    steps = Steps()
    for _ in range(6):
        steps.stage(ws)  # the same seed and data: the trainer's weights at step 6
    for (n, a), b in zip(model.state_dict().items(), steps.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), n


def test_a_worker_holding_v_fetches_only_the_deltas_after_it(tmp_path):
    ws = WeightStore(tmp_path / "weights")
    publish_steps(ws, 7)
    size = {v: ws.manifest("solver", v).total_bytes for v in range(7)}
    r = reader(ws)
    r.load("solver", 1)
    assert r.bytes_fetched == size[0] + size[1]  # nothing held: the snapshot, then v1
    before = r.bytes_fetched
    r.load("solver", 3)
    assert r.bytes_fetched - before == size[2] + size[3]  # from the v1 it holds
    far = reader(ws)
    far.load("solver", 6)  # far behind: the newer snapshot (v4) and its chain, not v0's
    assert far.bytes_fetched == size[4] + size[5] + size[6]


def test_tampered_or_missing_delta_is_refused(tmp_path):
    ws = WeightStore(tmp_path / "weights")
    publish_steps(ws, 4)
    payload = ws.dir("solver", 2) / ("model.safetensors" + SUFFIX)
    data = bytearray(payload.read_bytes())
    data[len(data) // 2] ^= 0x01
    payload.write_bytes(bytes(data))
    r = reader(ws)
    for v in (2, 3):  # v3 is rebuilt through v2
        with pytest.raises(TamperedWeights, match="sha256"):
            r.load("solver", v)
    assert sha(r.load("solver", 1) / "model.safetensors") == ws.manifest(
        "solver", 1).served["model.safetensors"]["sha256"]
    payload.unlink()
    with pytest.raises(TamperedWeights, match="missing"):
        reader(ws).load("solver", 3)


def test_tampered_rebuilt_copy_is_rebuilt_not_served(tmp_path):
    ws = WeightStore(tmp_path / "weights")
    digests = publish_steps(ws, 3)
    held = ws.load("solver", 2) / "model.safetensors"  # the trainer's own copy
    data = bytearray(held.read_bytes())
    data[-5] ^= 0x40
    held.write_bytes(bytes(data))
    assert sha(WeightStore(ws.root).load("solver", 2) / "model.safetensors") == digests[2]


def test_worker_refuses_a_tampered_delta_and_keeps_its_weights(tmp_path, tiny_policy_dir, caplog):
    import logging

    from astraflow.rollout.worker import RolloutWorker
    from tests.runs import seeded_run, worker_flow

    ctx = seeded_run(tmp_path / "run", worker_flow(), tiny_policy_dir, versions=1)
    ws = ctx.weights()
    w = RolloutWorker(ctx, "wA")
    assert w.refresh_weights() and w.version == 0
    steps = Steps()
    steps.model = __import__("astraflow.models.hf", fromlist=["x"]).load_policy(ws.load("solver", 0))
    steps.opt = torch.optim.AdamW(steps.model.parameters(), lr=1e-3)
    d, _ = steps.stage(ws)
    assert ws.publish("solver", d, step=1, delta_chain=CHAIN) == 1
    assert ws.manifest("solver", 1).delta is not None
    shutil.rmtree(Path(ws.root) / ".rebuilt")  # the trainer's copy: this worker is elsewhere
    (ws.dir("solver", 1) / ("model.safetensors" + SUFFIX)).write_bytes(b"\x28\xb5\x2f\xfd" * 64)
    with caplog.at_level(logging.WARNING, logger="astraflow.rollout"):
        assert not w.refresh_weights()
    assert w.version == 0 and "refusing solver v1" in caplog.text and "keeping v0" in caplog.text


def test_prune_keeps_every_chain_a_kept_version_needs(tmp_path):
    ws = WeightStore(tmp_path / "weights")
    digests = publish_steps(ws, 11, chain=8)  # v0 whole, v1..v8 deltas, v9 whole, v10 delta
    assert ws.prune("solver", keep_last=2, keep_every=0) == list(range(1, 9))
    assert ws.versions("solver") == [0, 9, 10]
    ws2 = WeightStore(tmp_path / "w2")
    publish_steps(ws2, 8, chain=8)
    assert ws2.prune("solver", keep_last=2, keep_every=0) == []  # v7 is rebuilt from v0..v6
    ws3 = WeightStore(tmp_path / "w3")
    publish_steps(ws3, 11, chain=8)
    assert ws3.prune("solver", keep_last=1, keep_every=3) == [7, 8]  # v6 needs v1..v5
    for store, last in ((ws, 10), (ws3, 10)):
        r = reader(store)
        for v in store.versions("solver"):
            assert sha(r.load("solver", v) / "model.safetensors") == digests[v]
        assert last in store.versions("solver")


KILL = """
import os, signal, sys
from pathlib import Path
from astraflow.stores import WeightStore
from astraflow.stores.objects import ObjectStore
put = ObjectStore.put_bytes
def put_then_die(self, rel, data):
    if rel.endswith("MANIFEST.json"):
        Path(sys.argv[3]).write_text("payload in place")
        os.kill(os.getpid(), signal.SIGKILL)
    return put(self, rel, data)
ObjectStore.put_bytes = put_then_die
WeightStore(sys.argv[1]).publish("solver", Path(sys.argv[2]), step=99, delta_chain=3)
"""


def test_sigkill_between_a_delta_payload_and_its_manifest(tmp_path):
    ws = WeightStore(tmp_path / "weights")
    digests = publish_steps(ws, 3)
    steps = Steps()  # the same seed and data: it reaches v2's weights, then one step more
    for _ in range(2):
        shutil.rmtree(steps.stage(ws)[0])
    staged, h = steps.stage(ws)
    again = tmp_path / "again"
    shutil.copytree(staged, again)
    marker = tmp_path / "died"
    proc = subprocess.run([sys.executable, "-c", KILL, str(ws.root), str(staged), str(marker)],
                          cwd=Path(__file__).parents[1])
    assert proc.returncode == -signal.SIGKILL and marker.read_text() == "payload in place"
    assert (ws.dir("solver", 3) / ("model.safetensors" + SUFFIX)).is_file()  # the payload...
    assert ws.versions("solver") == [0, 1, 2]  # ...of a version that does not exist
    assert [sha(reader(ws).load("solver", v) / "model.safetensors") for v in range(3)] == digests
    # the restarted trainer publishes that step again: the same number, a chain that holds
    assert ws.publish("solver", again, step=3, delta_chain=3) == 3
    r = reader(ws)
    assert [sha(r.load("solver", v) / "model.safetensors") for v in range(4)] == digests + [h]


def test_deltas_on_s3_and_a_replica_in_another_region(two_stores, monkeypatch, tmp_path):  # noqa: F811
    """The trainer publishes deltas to server A; the mirror copies payloads (with the
    chain each needs) to server B; a worker there with an empty cache rebuilds exactly,
    and a worker holding a version fetches only the newer deltas."""
    from astraflow.stores.mirror import sync_replica

    src, dst, _, _ = two_stores
    digests = publish_steps(src, 6)  # v0 whole, v1..v3 deltas, v4 whole, v5 delta
    assert sync_replica(src, dst, "solver", keep_last=1) == [4, 5, 0]  # v5 needs v4
    for v in (0, 4, 5):
        a, b = src.manifest("solver", v), dst.manifest("solver", v)
        assert (a.files, a.delta, a.time) == (b.files, b.delta, b.time)
    stored = dst.objects.sizes(dst._rel("solver", 5))
    assert set(stored) == {"MANIFEST.json", *src.manifest("solver", 5).files}
    monkeypatch.setenv("ASTRAFLOW_CACHE", str(tmp_path / "worker-cache"))
    eu = WeightStore(dst.objects.uri, settings=dst.objects.settings)
    assert sha(eu.load("solver", 5) / "model.safetensors") == digests[5]
    assert eu.bytes_fetched == sum(dst.manifest("solver", v).total_bytes for v in (4, 5))
    steps = Steps()
    for _ in range(6):
        shutil.rmtree(steps.stage(src)[0])
    d, h = steps.stage(src)
    assert src.publish("solver", d, step=6, delta_chain=CHAIN) == 6
    assert sync_replica(src, dst, "solver", keep_last=1) == [6]
    before = eu.bytes_fetched
    assert sha(eu.load("solver", 6) / "model.safetensors") == h
    assert eu.bytes_fetched - before == dst.manifest("solver", 6).total_bytes
    assert eu.load("solver", 6, refresh=True)  # the audit's check: every object, from v4 up
    assert dst.versions("solver") == [0, 4, 5, 6]  # pruning kept v6's chain (v4, v5)


@pytest.mark.slow
def test_rl_learns_with_workers_loading_weights_through_deltas(tmp_path):
    """tests/test_learning.py's RL run, but the sampler's weights come through the store:
    the trainer publishes each step as a delta, a separate reader rebuilds it and the
    engine swaps it in. The reward still rises, and the reader fetched deltas."""
    from astraflow.models.factory import save_policy
    from astraflow.models.weights import load_weights_into
    from tests.test_learning import _rl, _warm_start

    trainer, worker = WeightStore(tmp_path / "w"), WeightStore(tmp_path / "w")
    start, acc0 = _warm_start()
    d = trainer.staging_dir("solver")
    save_policy(start, None, d)
    trainer.publish("solver", d, step=0)

    def via(model: torch.nn.Module, served: torch.nn.Module) -> None:
        staged = trainer.staging_dir("solver")
        save_policy(model, None, staged)
        v = trainer.publish("solver", staged, step=0, delta_chain=8)
        load_weights_into(served, worker.load("solver", v))

    curve, acc = _rl(start, steps=60, shuffle=False, via=via)
    first, last = sum(curve[:10]) / 10, sum(curve[-10:]) / 10
    summary = f"warm acc {acc0:.2f}; reward {first:.3f} → {last:.3f}, acc {acc:.2f}"
    print(summary)
    assert last >= first + 0.06 and acc >= acc0, summary
    mans = [trainer.manifest("solver", v) for v in trainer.versions("solver")]
    assert sum(m.delta is not None for m in mans) >= 50  # 8 deltas, then a snapshot
    # each version once, as stored: a delta after the version held, a snapshot whole
    assert worker.bytes_fetched == sum(m.total_bytes for m in mans)
    assert worker.bytes_fetched < 0.95 * mans[0].total_bytes * len(mans)


@pytest.mark.slow
def test_trainer_sigkilled_between_a_delta_and_its_manifest_loses_nothing(tmp_path):
    """A real run publishing deltas from the trainer's background publisher; the trainer
    is SIGKILLed once with version 3's payload in the store and no manifest. The
    launcher restarts it; the audit finds every row trained once and every version,
    rebuilt from the store's objects, verifies."""
    import json

    from tests.test_kill import KILL_FLOW, start_run, stop_run

    flow = {**KILL_FLOW, "name": "deltas", "store": {"delta_chain": 3, "keep_last": 3},
            "stop": {**KILL_FLOW["stop"], "max_steps": 16}}
    gate = tmp_path / "gate"
    launcher, run = start_run(tmp_path, flow, {"ASTRAFLOW_TEST_KILL_BEFORE_MANIFEST": "3",
                                               "ASTRAFLOW_TEST_GATE": str(gate)})
    try:
        out, _ = launcher.communicate(timeout=400)
    finally:
        stop_run(launcher, run)
    assert launcher.returncode == 0, out
    assert (gate / "killed-solver-v3").exists()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "max_steps" and summary["restarts"]["trainer-solver"] == 1
    audit = subprocess.run([sys.executable, "-m", "astraflow", "audit", str(run), "--json"],
                           capture_output=True, text=True, timeout=120)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    counts = json.loads(audit.stdout)["policies"]["solver"]
    assert counts["steps"] == 16 and counts["duplicate_rows"] == 0 and counts["violations"] == 0
    ws = WeightStore(run / "weights")
    kept = ws.versions("solver")
    mans = [ws.manifest("solver", v) for v in kept]
    assert any(m.delta for m in mans) and kept[-1] >= 6
    r = reader(ws)
    for m in mans:
        path = r.load("solver", m.version)
        assert sha(path / "model.safetensors") == m.served["model.safetensors"]["sha256"]
