"""Publish + fetch of a weight version against a plain copy of the same bytes.

    python benchmarks/weights.py [--repeats 5] [--sizes math,16m]
    python benchmarks/weights.py --lora 8 [--sizes 16m,smollm2]   # full vs adapter
    python benchmarks/weights.py --deltas runs/math/weights/solver  # whole vs delta
    python benchmarks/weights.py --wan [--mbps 200 --rtt-ms 80]     # whole vs delta over a WAN

What a version costs beyond moving its bytes: the weight store hashes every file
(sha256) on publish, writes a manifest last, lists versions to find the newest,
and verifies every file again on load. The baseline moves the same files with
no manifest and no checks, through the same filesystem client:

    local   publish = hash + rename into the store      plain = copy into a folder
            fetch   = list + verify in place            plain = read every byte
    s3      publish = hash + PUT each file + manifest   plain = PUT each file
            fetch   = list + GET each file + verify     plain = GET each file
    mirror  publish to A, mirror A→B (verify, PUT,      plain = PUT to A, GET from A,
            size-check, manifest), fetch from B                 PUT to B, GET from B

The S3 rows run against two moto servers on 127.0.0.1 (started and stopped
here), so they measure request overhead and the local disk, not a WAN; the
ratio is the claim (aim: at most 1.3). Sizes: `math` is the math flow's model
(4 MB, so per-request costs dominate); `NNm` is a model of about NN million
parameters in float32 (large files: hashing and bandwidth dominate); `smollm2`
is SmolLM2-135M-Instruct (tests/hf_fixtures.py's cached import).

`--deltas DIR` reports instead, from a run's own versions, how many bytes a version
costs stored as a delta (benchmarks/weight_deltas.py; docs/weights.md).

`--wan` measures instead, on S3 behind a capped, delayed link, the time until a replica
and a remote worker hold the newest version, whole vs deltas (benchmarks/weights_wan.py).

`--lora R` measures instead what a version of a LoRA policy costs against a full
version of the same model, per version and through the same code: the trainer's
save (`save_policy`), publish (hash, rename or PUT, manifest), a worker's fetch
(list, GET, verify) and its engine swap (`HFEngine.load_weights`: the whole
state dict, or the adapter merged into the kept base). Version 0 (the base) is
published and fetched once before timing, as a worker holds it for the whole
run, and one untimed version of each kind warms up (the hf engine's first
adapter swap keeps the base values of the adapted weights aside, once). Printed:
bytes and seconds per version, and adapter / full as ratios.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

def model_dir(size: str, root: Path) -> Path:
    from astraflow.config.loader import load_flow
    from astraflow.models.factory import save_policy, tiny_llama
    from astraflow.models.tokenizer import build_char_tokenizer

    if size == "smollm2":
        from tests.hf_fixtures import models_cache

        d = models_cache() / "smollm2-135m-instruct"
        if not (d / "model.safetensors").is_file():
            raise SystemExit(f"{d} missing: run tests/test_hf_models.py once (it imports SmolLM2)")
        return d
    if size == "math":
        m = load_flow(ROOT / "examples/math.yaml").policies[0].model
        model = tiny_llama(hidden_size=m.hidden_size, layers=m.layers, heads=m.heads,
                           intermediate_size=m.intermediate_size)
    else:
        millions = float(size.rstrip("m"))
        hidden = 512
        layers = max(1, round(millions * 1e6 / (16 * hidden * hidden)))  # 4h² attention + 12h² MLP
        model = tiny_llama(hidden_size=hidden, layers=layers, heads=8, intermediate_size=4 * hidden)
    d = root / f"model-{size}"
    d.mkdir(parents=True)
    save_policy(model, build_char_tokenizer(), d)
    return d


def read_all(d: Path) -> int:
    n = 0
    for p in sorted(d.iterdir()):
        with p.open("rb") as f:
            while chunk := f.read(8 << 20):
                n += len(chunk)
    return n


def bench_local(src: Path, work: Path, repeats: int) -> tuple[list[float], list[float]]:
    from astraflow.stores import WeightStore

    ours, plain = [], []
    ws = WeightStore(work / "store")
    for i in range(repeats):
        staged = ws.staging_dir("p")
        shutil.copytree(src, staged, dirs_exist_ok=True)
        t0 = time.perf_counter()
        ws.publish("p", staged, step=i)
        reader = WeightStore(work / "store")
        read_all(reader.load("p", reader.latest("p")))  # verify, then what a worker's load reads
        t1 = time.perf_counter()
        shutil.copytree(src, work / f"plain-{i}")
        read_all(work / f"plain-{i}")
        t2 = time.perf_counter()
        ours.append(t1 - t0)
        plain.append(t2 - t1)
    return ours, plain


def bench_s3(src: Path, bucket: str, work: Path, repeats: int) -> tuple[list[float], list[float]]:
    from astraflow.stores import ObjectStore, WeightStore

    ours, plain = [], []
    uri = f"s3://{bucket}/bench-{uuid.uuid4().hex[:6]}"
    ws = WeightStore(f"{uri}/weights")
    objects = ObjectStore(f"{uri}/plain")
    names = sorted(p.name for p in src.iterdir())
    for i in range(repeats):
        staged = ws.staging_dir("p")
        shutil.copytree(src, staged, dirs_exist_ok=True)
        t0 = time.perf_counter()
        ws.publish("p", staged, step=i)
        reader = WeightStore(f"{uri}/weights")  # a worker that holds nothing yet
        reader.load("p", reader.latest("p"))
        t1 = time.perf_counter()
        for n in names:
            objects.put_file(src / n, f"v{i}/{n}")
        for n in names:
            objects.get_file(f"v{i}/{n}", work / f"plain-{i}" / n)
        t2 = time.perf_counter()
        ours.append(t1 - t0)
        plain.append(t2 - t1)
    return ours, plain


def bench_mirror(src: Path, bucket_a: str, bucket_b: str, endpoint_b: str, work: Path,
                 repeats: int) -> tuple[list[float], list[float]]:
    from astraflow.stores import ObjectStore, WeightStore
    from astraflow.stores.mirror import sync_replica
    from astraflow.stores.uri import S3Settings

    b = S3Settings.from_env(endpoint=endpoint_b)
    tag = uuid.uuid4().hex[:6]
    ours, plain = [], []
    main = WeightStore(f"s3://{bucket_a}/m-{tag}")
    replica = WeightStore(f"s3://{bucket_b}/m-{tag}", settings=b)
    plain_a = ObjectStore(f"s3://{bucket_a}/p-{tag}")
    plain_b = ObjectStore(f"s3://{bucket_b}/p-{tag}", settings=b)
    names = sorted(p.name for p in src.iterdir())
    for i in range(repeats):
        staged = main.staging_dir("p")
        shutil.copytree(src, staged, dirs_exist_ok=True)
        t0 = time.perf_counter()
        main.publish("p", staged, step=i)
        sync_replica(main, replica, "p", keep_last=2)
        reader = WeightStore(f"s3://{bucket_b}/m-{tag}", settings=b)
        reader.load("p", reader.latest("p"))
        t1 = time.perf_counter()
        for n in names:
            plain_a.put_file(src / n, f"v{i}/{n}")
        for n in names:
            plain_a.get_file(f"v{i}/{n}", work / f"hop-{i}" / n)
            plain_b.put_file(work / f"hop-{i}" / n, f"v{i}/{n}")
        for n in names:
            plain_b.get_file(f"v{i}/{n}", work / f"plain-{i}" / n)
        t2 = time.perf_counter()
        ours.append(t1 - t0)
        plain.append(t2 - t1)
    return ours, plain


def bench_version(model, ws, reader, engine, repeats: int) -> tuple[float, float]:
    """(bytes, median seconds) of one version of `model`: save, publish, fetch, swap."""
    from astraflow.models.hf import save_policy

    carried = reader_files = None
    times, size = [], 0
    for i in range(repeats + 1):  # the first is a warm-up (a worker's first swap keeps
        # the adapted weights' base values aside, once per run): not timed
        if carried is None:
            from astraflow.models.hf import carried_files

            reader_files = reader.load("p", 0)
            carried = carried_files(reader_files)
        t0 = time.perf_counter()
        staged = ws.staging_dir("p")
        save_policy(model, staged, source=carried)
        v = ws.publish("p", staged, step=i + 1)
        path = reader.load("p", v)
        engine.load_weights(path)
        if i:
            times.append(time.perf_counter() - t0)
        size = ws.manifest("p", v).total_bytes
    return float(size), statistics.median(times)


def bench_lora(src: Path, store: str, rank: int, repeats: int) -> dict[str, tuple[float, float]]:
    """Full vs adapter versions of the model at `src` in a store at `store`."""
    import torch

    from astraflow.config.model import LoraSpec
    from astraflow.models.hf import load_policy
    from astraflow.rollout.engine import HFEngine
    from astraflow.stores import WeightStore

    out = {}
    for kind in ("full", "adapter"):
        uri = f"{store}/{kind}-{uuid.uuid4().hex[:6]}"
        ws, reader = WeightStore(uri), WeightStore(uri)
        staged = ws.staging_dir("p")
        shutil.copytree(src, staged, dirs_exist_ok=True)
        ws.publish("p", staged, step=0, version=0)  # the base, held by workers all run
        engine = HFEngine.from_dir(reader.load("p", 0))
        model = load_policy(reader.load("p", 0),
                            lora=LoraSpec(r=rank) if kind == "adapter" else None)
        with torch.no_grad():  # trained-looking weights: B is zero at init
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(torch.randn_like(p) * 1e-3)
        out[kind] = bench_version(model, ws, reader, engine, repeats)
    return out


def main_lora(args) -> None:
    import os

    import torch
    from rich.console import Console
    from rich.table import Table

    from tests.s3server import MotoServer

    torch.set_num_threads(1)
    console = Console()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["ASTRAFLOW_CACHE"] = str(work / "cache")
        with MotoServer(work / "moto") as a:
            os.environ.update(a.env())
            bucket = a.create_bucket("bench-lora")
            for size in args.sizes.split(","):
                src = model_dir(size, work)
                stores = {"local": str(work / "store"), "s3": f"s3://{bucket}"}
                for store in args.stores.split(","):
                    uri = stores[store]
                    res = bench_lora(src, uri, args.lora, args.repeats)
                    (fb, fs), (ab, as_) = res["full"], res["adapter"]
                    rows.append((size, store, fb, fs, ab, as_))
                    console.print(f"{size:>7} {store:<5} full {fb / 1e6:8.2f} MB "
                                  f"{fs * 1e3:8.1f} ms  adapter {ab / 1e6:6.2f} MB "
                                  f"{as_ * 1e3:7.1f} ms  bytes {ab / fb:.4f}  seconds "
                                  f"{as_ / fs:.3f}")
    t = Table(title=f"one version of a LoRA (r={args.lora}) policy vs a full version: save + "
                    f"publish + fetch + engine swap, median of {args.repeats}")
    for col in ("model", "store", "full MB", "full ms", "adapter MB", "adapter ms",
                "bytes ratio", "seconds ratio"):
        t.add_column(col, justify="right")
    for size, store, fb, fs, ab, as_ in rows:
        t.add_row(size, store, f"{fb / 1e6:.2f}", f"{fs * 1e3:.1f}", f"{ab / 1e6:.3f}",
                  f"{as_ * 1e3:.1f}", f"{ab / fb:.4f}", f"{as_ / fs:.3f}")
    console.print(t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sizes", default="math,16m",
                    help="comma list: math, NNm parameters, or smollm2")
    ap.add_argument("--lora", type=int, default=0, metavar="R",
                    help="compare full versions with rank-R adapter versions instead")
    ap.add_argument("--stores", default="local,s3", help="with --lora: local, s3 (moto)")
    ap.add_argument("--deltas", metavar="DIR", help="a run's weights/<policy> folder: bytes of "
                    "each version whole vs as a delta, per step (benchmarks/weight_deltas.py)")
    ap.add_argument("--wan", action="store_true", help="whole vs delta versions over a capped, "
                    "delayed link to S3 (benchmarks/weights_wan.py)")
    ap.add_argument("--versions", type=int, default=5, help="with --wan: versions timed")
    ap.add_argument("--chain", type=int, default=8, help="with --wan: store.delta_chain")
    ap.add_argument("--rtt-ms", type=float, default=80.0, help="with --wan: ms added per request")
    ap.add_argument("--mbps", type=float, default=200.0, help="with --wan: Mbit/s each way")
    args = ap.parse_args()
    if args.wan:
        from benchmarks.weights_wan import main as main_wan

        return main_wan(args)
    if args.deltas:
        from benchmarks.weight_deltas import main as main_deltas

        return main_deltas(args.deltas)
    if args.lora:
        return main_lora(args)

    import os

    from rich.console import Console
    from rich.table import Table

    from tests.s3server import MotoServer

    console = Console()
    rows: list[tuple[str, str, float, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["ASTRAFLOW_CACHE"] = str(work / "cache")
        with MotoServer(work / "moto-a") as a, MotoServer(work / "moto-b") as b:
            os.environ.update(a.env())
            bucket_a, bucket_b = a.create_bucket("bench-a"), b.create_bucket("bench-b")
            for size in args.sizes.split(","):
                src = model_dir(size, work)
                mb = sum(p.stat().st_size for p in src.iterdir()) / 1e6
                cases: list[tuple[str, Callable[[Path], tuple[list[float], list[float]]]]] = [
                    ("local", lambda w, src=src: bench_local(src, w, args.repeats)),
                    ("s3", lambda w, src=src: bench_s3(src, bucket_a, w, args.repeats)),
                    ("s3 mirror A→B", lambda w, src=src: bench_mirror(
                        src, bucket_a, bucket_b, b.endpoint, w, args.repeats)),
                ]
                for name, fn in cases:
                    w = work / f"{size}-{name.split()[0]}-{uuid.uuid4().hex[:4]}"
                    w.mkdir()
                    ours, plain = fn(w)
                    o, p = statistics.median(ours), statistics.median(plain)
                    rows.append((size, name, mb, o, p))
                    console.print(f"{size:>5} {name:<14} {mb:7.1f} MB  ours {o * 1e3:8.1f} ms  "
                                  f"plain {p * 1e3:8.1f} ms  ratio {o / p:5.2f}")
    t = Table(title=f"publish + fetch of one version, median of {args.repeats} (aim: ratio ≤ 1.3)")
    for col in ("model", "store", "MB", "ours ms", "plain copy ms", "ratio"):
        t.add_column(col, justify="right")
    for size, name, mb, o, p in rows:
        t.add_row(size, name, f"{mb:.1f}", f"{o * 1e3:.1f}", f"{p * 1e3:.1f}", f"{o / p:.2f}")
    console.print(t)


if __name__ == "__main__":
    main()
