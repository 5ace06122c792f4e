"""Weight versions over a WAN link: whole versions against deltas, on S3 (moto).

    python benchmarks/weights.py --wan [--versions 5] [--rtt-ms 80] [--mbps 200]

Two moto servers on 127.0.0.1 stand for two regions: A holds the run's store (the
trainer publishes to it directly), B a replica across an ocean. Each path that
crosses goes through a proxy (benchmarks/latency_proxy.py) that adds `--rtt-ms` to
every request's round trip and carries at most `--mbps` each way over all its
connections: the mirror's writes to B, and a remote worker's reads from A. The
versions are SmolLM2-135M-sized and real to start: its weights (float32) are the
trainer's master copy, each step adds lr x N(0, 1) per element (lr 1e-5, seeded),
and each version is that master cast to bfloat16, as a bfloat16 engine serves it
(synthetic steps: real AdamW steps are measured in docs/weights.md). Per version:
the bytes stored, publish time, the time until the replica holds it (publish + mirror)
and until a worker in B's region holding the previous version holds it over the link.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
import uuid
from pathlib import Path

MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json",
               "tokenizer_config.json")
LR = 1e-5


def make_versions(root: Path, n: int) -> list[Path]:
    """`n` + 1 consecutive bfloat16 versions of SmolLM2-135M (v0: its own weights)."""
    import torch
    from safetensors.torch import load_file, save_file

    from tests.hf_fixtures import models_cache

    src = models_cache() / "smollm2-135m-instruct"
    if not (src / "model.safetensors").is_file():
        raise SystemExit(f"{src} missing: run tests/test_hf_models.py once (it imports SmolLM2)")
    master = {k: v.float() for k, v in load_file(str(src / "model.safetensors")).items()}
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(n + 1):
        if i:
            for v in master.values():
                v.add_(torch.randn(v.shape, generator=gen), alpha=LR)
        d = root / f"v{i}"
        d.mkdir(parents=True)
        save_file({k: v.to(torch.bfloat16).contiguous() for k, v in master.items()},
                  str(d / "model.safetensors"))
        for name in MODEL_FILES:
            if (src / name).is_file():
                shutil.copy2(src / name, d / name)
        out.append(d)
    return out


def run_mode(versions: list[Path], chain: int, bucket_a: str, bucket_b: str, via_a: str,
             via_b: str) -> list[dict[str, float]]:
    """Publish every version with `delta_chain` = `chain` (0: whole); per version after
    v0 (which the replica and the worker hold before timing): bytes and seconds."""
    from astraflow.stores import WeightStore
    from astraflow.stores.mirror import sync_replica
    from astraflow.stores.uri import S3Settings

    tag = uuid.uuid4().hex[:6]
    main = WeightStore(f"s3://{bucket_a}/w-{tag}")
    replica = WeightStore(f"s3://{bucket_b}/w-{tag}", settings=S3Settings.from_env(endpoint=via_b))
    worker = WeightStore(f"s3://{bucket_a}/w-{tag}", settings=S3Settings.from_env(endpoint=via_a))
    rows = []
    for i, src in enumerate(versions):
        staged = main.staging_dir("p")
        shutil.copytree(src, staged, dirs_exist_ok=True)
        t0 = time.perf_counter()
        v = main.publish("p", staged, step=i, delta_chain=chain)
        t1 = time.perf_counter()
        sync_replica(main, replica, "p", keep_last=3)
        t2 = time.perf_counter()
        got = worker.bytes_fetched
        worker.load("p", worker.latest("p"))
        t3 = time.perf_counter()
        main.prune("p", keep_last=3)
        man = main.manifest("p", v)
        if i:
            rows.append({"bytes": man.total_bytes, "fetched": worker.bytes_fetched - got,
                         "publish": t1 - t0, "replica": t2 - t0, "worker": (t1 - t0) + (t3 - t2),
                         "mirror": t2 - t1, "fetch": t3 - t2, "delta": man.delta is not None})
        print(f"  chain {chain} v{v}: {man.total_bytes / 1e6:7.1f} MB stored, publish "
              f"{t1 - t0:5.2f} s, mirror {t2 - t1:5.2f} s, worker fetch {t3 - t2:5.2f} s"
              + ("" if i else " (untimed: v0)"), flush=True)
    return rows


def main(args) -> None:
    import tempfile

    from benchmarks.latency_proxy import LatencyProxy
    from tests.s3server import MotoServer

    rate = args.mbps * 1e6
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["ASTRAFLOW_CACHE"] = str(work / "cache")
        t0 = time.perf_counter()
        versions = make_versions(work / "versions", args.versions)
        whole = (versions[0] / "model.safetensors").stat().st_size
        print(f"{len(versions)} versions of SmolLM2-135M in bfloat16 ({whole / 1e6:.0f} MB of "
              f"weights each), made in {time.perf_counter() - t0:.0f} s; link: +{args.rtt_ms:g} ms "
              f"a request, {args.mbps:g} Mbit/s each way", flush=True)
        with MotoServer(work / "moto-a") as a, MotoServer(work / "moto-b") as b:
            os.environ.update(a.env())
            bucket_a, bucket_b = a.create_bucket("wan-a"), b.create_bucket("wan-b")
            pa = LatencyProxy(a.port, delay_s=args.rtt_ms / 1e3, rate_bps=rate)
            pb = LatencyProxy(b.port, delay_s=args.rtt_ms / 1e3, rate_bps=rate)
            try:
                res = {c: run_mode(versions, c, bucket_a, bucket_b, pa.endpoint, pb.endpoint)
                       for c in (0, args.chain)}
            finally:
                pa.stop()
                pb.stop()
    report(res, args.chain)


def report(res: dict[int, list[dict[str, float]]], chain: int) -> None:
    """Medians per version, deltas over whole, and over a chain (a snapshot, whose cost
    is a whole version's, and `chain` deltas)."""
    whole, delta = res[0], [r for r in res[chain] if r["delta"]]
    if not delta:
        raise SystemExit("no delta version was published: nothing to compare")
    print(f"\nmedian per version over {len(delta)} steps (whole: delta_chain 0; deltas: "
          f"delta_chain {chain}; over a chain: 1 snapshot + {chain} deltas)")
    print(f"{'':28}{'whole':>10}{'delta':>10}{'delta/whole':>13}{'over a chain':>14}  aim")
    for key, label, unit, aim in (
            ("bytes", "bytes stored", 1e6, 0.25), ("publish", "publish (s)", 1, None),
            ("replica", "replica holds it (s)", 1, 0.3), ("worker", "worker holds it (s)", 1, 0.3)):
        w = statistics.median(r[key] for r in whole)
        d = statistics.median(r[key] for r in delta)
        avg = (w + chain * d) / (chain + 1)
        ok = "" if aim is None else f"<= {aim}: " + ("met" if avg / w <= aim else "NOT met")
        print(f"{label:<28}{w / unit:>10.2f}{d / unit:>10.2f}{d / w:>13.3f}{avg / w:>14.3f}  {ok}"
              + ("  (MB)" if key == "bytes" else ""))
