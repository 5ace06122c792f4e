"""A policy's version-0 network: the tiny Llama built from scratch, or a pretrained model.

Loading and publishing every later version, tiny or pretrained, is `astraflow.models.hf`;
the tiny model's character tokenizer is `astraflow.models.tokenizer`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from astraflow.models.hf import from_pretrained, resolve_dtype
from astraflow.models.hf import save_policy as hf_save_policy
from astraflow.models.tokenizer import ALPHABETS, alphabet_vocab, build_char_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from astraflow.config.model import ModelSpec


def tiny_llama(
    *, hidden_size: int = 128, layers: int = 4, heads: int = 4, intermediate_size: int = 512,
    max_positions: int = 64, seed: int = 0, alphabet: str = "math",
) -> LlamaForCausalLM:
    """About 1 M parameters with a 32-symbol vocab (`alphabet: ascii`: 100 symbols, for
    the tool-using workloads); head size 32 fits vLLM's CPU attention."""
    tok = build_char_tokenizer(alphabet)
    config = LlamaConfig(
        vocab_size=len(tok.get_vocab()), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=max_positions, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    return model


def save_policy(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast | None, path: Path) -> None:
    """Save a tiny (character-vocabulary) policy: `hf.save_policy` with the character
    tokenizer as its source. Only for tiny models built here; every other policy
    publishes through `astraflow.models.hf.save_policy` with the source it was loaded
    from, and this refuses them rather than give them the character tokenizer."""
    sizes = {len(alphabet_vocab(a)): a for a in ALPHABETS}
    vocab = getattr(model.config, "vocab_size", None)
    if tokenizer is None and vocab in sizes:
        tokenizer = build_char_tokenizer(sizes[vocab])
    if tokenizer is None or len(tokenizer.get_vocab()) != vocab:
        raise ValueError(f"save_policy(model, tokenizer, path) writes a character "
                         f"tokenizer ({sorted(sizes)} symbols); this model's vocab is "
                         f"{model.config.vocab_size}: use astraflow.models.hf.save_policy("
                         f"model, path, source=<the folder it was loaded from>)")
    with tempfile.TemporaryDirectory(prefix="astraflow-tok-") as tmp:
        tokenizer.save_pretrained(tmp)
        hf_save_policy(model, path, source=tmp)


def build_model(spec: ModelSpec, *, seed: int = 0, device: str | torch.device = "cpu"
                ) -> PreTrainedModel:
    """The policy's version-0 network: a fresh tiny Llama (seeded), or the pretrained
    model at `spec.path` in the spec's dtype."""
    if spec.kind == "tiny":
        model = tiny_llama(hidden_size=spec.hidden_size, layers=spec.layers, heads=spec.heads,
                           intermediate_size=spec.intermediate_size, seed=seed,
                           alphabet=spec.alphabet, max_positions=spec.max_positions)
        return model.to(device=device, dtype=resolve_dtype(spec.dtype, device))
    assert spec.path is not None  # ModelSpec refuses hf without a path
    # A source may still ship pickled weights (pytorch_model.bin): transformers loads
    # them (safetensors first when both exist), and every version we write is
    # safetensors. Versions themselves are read with `load_policy`: safetensors only.
    return from_pretrained(spec.path, dtype=spec.dtype, device=device, use_safetensors=None)
