"""Policy factory: build the tiny Llama, save/load it in HF format.

Every policy version is a plain HF folder (config.json, model.safetensors,
tokenizer files), so the same bytes serve the hf engine, vLLM, and any user's
`AutoModelForCausalLM.from_pretrained`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from .tokenizer import build_char_tokenizer


def tiny_llama(
    *, hidden_size: int = 128, layers: int = 4, heads: int = 4, intermediate_size: int = 512,
    max_positions: int = 64, seed: int = 0,
) -> LlamaForCausalLM:
    """About 1 M parameters with a 32-symbol vocab; head size 32 fits vLLM's CPU attention."""
    tok = build_char_tokenizer()
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
    """Save safetensors weights + config (+ tokenizer) in HF layout."""
    model.save_pretrained(str(path), safe_serialization=True)
    (tokenizer or build_char_tokenizer()).save_pretrained(str(path))
    for p in Path(path).iterdir():  # keep only what the weight store allows
        if p.suffix not in (".safetensors", ".json", ".txt", ".jinja"):
            p.unlink()


def load_policy(path: Path) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(str(path), use_safetensors=True)
    model.eval()
    return model


def load_weights_into(model: torch.nn.Module, path: Path) -> None:
    """Swap weights in place from a verified version folder (no model rebuild)."""
    state = load_file(str(Path(path) / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"}
    if unexpected or set(missing) - tied:
        raise RuntimeError(
            f"weights at {path} do not fit the model: missing {missing}, unexpected {unexpected}"
        )
