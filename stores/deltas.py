"""A weight version as a delta: each weight file XOR its parent's, zstd-compressed.

Consecutive versions differ in few bits: in bf16 most elements do not change at all
in a step, and in fp32 the sign, exponent and high mantissa bits of a changed element
stay. XOR leaves those as zero bytes and zstd squeezes them out; measured on this
project's runs and the trade against sparse index/value lists in docs/weights.md.
A file whose parent has no file of that name and size is stored whole. Decoding
streams both files in chunks, so memory stays at a few chunks, not a model.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import zstandard

ENCODING = "xor-zstd"
#: Suffix of a delta payload: `model.safetensors` -> `model.safetensors.delta`.
SUFFIX = ".delta"
CHUNK = 1 << 24
LEVEL = 1


def digest(files: dict[str, dict]) -> str:
    """One sha256 over every served file's name and sha256: the tensors, as published."""
    lines = "".join(f"{n} {files[n]['sha256']}\n" for n in sorted(files))
    return hashlib.sha256(lines.encode()).hexdigest()


def deltable(name: str, new: Path, old_dir: Path) -> bool:
    """A weight file whose parent has a file of the same name and size."""
    old = old_dir / name
    return (name.endswith(".safetensors") and old.is_file()
            and old.stat().st_size == new.stat().st_size)


def _xor(a: bytes, b: bytes) -> bytes:
    return (np.frombuffer(a, np.uint8) ^ np.frombuffer(b, np.uint8)).tobytes()


def encode(old: Path, new: Path, out: Path) -> int:
    """Write zstd(new XOR old) to `out`; returns its size. Sizes must be equal."""
    cctx = zstandard.ZstdCompressor(level=LEVEL)
    with old.open("rb") as fo, new.open("rb") as fn, out.open("wb") as fw:
        with cctx.stream_writer(fw, closefd=False) as z:
            while chunk := fn.read(CHUNK):
                z.write(_xor(chunk, fo.read(len(chunk))))
    return out.stat().st_size


def decode(old: Path, delta: Path, out: Path) -> None:
    """Rebuild a file from its parent's and its delta, into a temp name then `out`."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    with old.open("rb") as fo, delta.open("rb") as fd, tmp.open("wb") as fw:
        with zstandard.ZstdDecompressor().stream_reader(fd) as z:
            while chunk := z.read(CHUNK):
                prev = fo.read(len(chunk))
                if len(prev) != len(chunk):
                    raise ValueError(f"{delta.name} is longer than {old.name}")
                fw.write(_xor(chunk, prev))
            if fo.read(1):
                raise ValueError(f"{delta.name} is shorter than {old.name}")
    os.replace(tmp, out)


def payload_name(name: str) -> str:
    return name + SUFFIX


def served_name(name: str) -> str:
    return name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name


def header(parent: int, base: int, depth: int, served: dict[str, dict]) -> dict:
    """The manifest's `delta` entry: the chain (parent, snapshot, depth) and the files
    the version serves once rebuilt, with the digest the rebuilt tensors must match."""
    return {"encoding": ENCODING, "parent": parent, "base": base, "depth": depth,
            "served": served, "digest": digest(served)}


def read_header(data: dict) -> dict | None:
    delta = data.get("delta")
    if delta is not None and delta.get("encoding") != ENCODING:
        raise ValueError(f"delta encoding {delta.get('encoding')!r} unknown "
                         f"(this version of astraflow reads {ENCODING})")
    return json.loads(json.dumps(delta)) if delta is not None else None
