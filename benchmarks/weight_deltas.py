"""Bytes of a weight version stored whole vs as a delta, from a run's own versions.

    python benchmarks/weights.py --deltas runs/smollm2-math/weights/solver

Each step is a pair of consecutive versions a run published (run it with
`--set store.keep_last=1000` so every version stays). Per step and per dtype (float32,
and bfloat16 as a bfloat16 engine serves the same weights): the fraction of elements
unchanged (sparsity), and each encoding's bytes as a fraction of a whole version in
that dtype: sparse index/value lists (raw, and zstd), XOR + zstd level 1 (the store's
encoding, stores/deltas.py) and XOR split into byte planes + zstd. Its time is printed
against a sha256 of the same bytes, which every publish already pays. Results and the
choice they led to: docs/weights.md.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from pathlib import Path

ENCODINGS = ("sparse", "sparse+zstd", "xor+zstd", "planes+zstd")


def flat(folder: Path, dtype):
    """Every tensor of a version, in `dtype`, as one integer array of its bit patterns."""
    import torch
    from safetensors.torch import load_file

    from astraflow.models.weights import weight_files

    sd = {k: v for f in weight_files(folder) for k, v in load_file(str(f)).items()}
    t = torch.cat([sd[k].to(dtype).reshape(-1) for k in sorted(sd)])
    return t.view(torch.int16 if dtype == torch.bfloat16 else torch.int32).numpy()


def step_costs(prev, cur) -> dict[str, float]:
    import numpy as np
    import zstandard

    from astraflow.stores import deltas

    z = zstandard.ZstdCompressor(level=deltas.LEVEL)
    x = prev ^ cur
    full, width = x.nbytes, x.itemsize
    changed = np.flatnonzero(x)
    gaps = np.diff(changed, prepend=0).astype(np.uint32).tobytes()
    t0 = time.perf_counter()
    xor = len(z.compress(x.tobytes()))
    t1 = time.perf_counter()
    hashlib.sha256(cur.tobytes()).hexdigest()
    t2 = time.perf_counter()
    planes = x.view(np.uint8).reshape(-1, width).T.copy().tobytes()
    return {"sparsity": 1 - changed.size / x.size,
            "sparse": changed.size * (4 + width) / full,
            "sparse+zstd": len(z.compress(gaps + cur[changed].tobytes())) / full,
            "xor+zstd": xor / full, "planes+zstd": len(z.compress(planes)) / full,
            "encode_vs_sha256": (t1 - t0) / max(t2 - t1, 1e-9)}


def main(folder: str) -> None:
    import torch
    from rich.console import Console
    from rich.table import Table

    from astraflow.stores import WeightStore

    path = Path(folder)
    ws, policy = WeightStore(path.parent), path.name
    versions = ws.versions(policy)
    if len(versions) < 2:
        raise SystemExit(f"{folder}: {len(versions)} version(s); a step needs two in a row")
    t = Table(title=f"{policy}: one version as a delta, median over {len(versions) - 1} steps "
                    f"(bytes as a fraction of a whole version in that dtype)")
    for col in ("dtype", "elements", "sparsity (min–max)", *ENCODINGS, "xor+zstd time / sha256"):
        t.add_column(col, justify="right")
    for dtype in (torch.float32, torch.bfloat16):
        prev, rows = None, []
        for v in versions:
            cur = flat(ws.load(policy, v), dtype)
            if prev is not None and prev.size == cur.size:
                rows.append(step_costs(prev, cur))
            prev = cur
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        sp = [r["sparsity"] for r in rows]
        t.add_row(str(dtype).removeprefix("torch."), f"{prev.size / 1e6:.1f} M",
                  f"{min(sp):.3f}–{max(sp):.3f}", *(f"{med[k]:.3f}x" for k in ENCODINGS),
                  f"{med['encode_vs_sha256']:.2f}x")
    Console().print(t)
