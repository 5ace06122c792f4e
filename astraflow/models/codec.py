"""The codec: the one thing that turns text into token ids and back, per policy.

Every weight version carries its tokenizer (and, for chat models, its chat template
and generation config); a codec is built from that folder, so a worker, a trainer and
an evaluator holding the same version encode a prompt to the very same ids.
`CharCodec` (astraflow.models.tokenizer) is the tiny model's character vocabulary, a
dict lookup per character and no chat template; `HFCodec` (here) wraps any Hugging
Face tokenizer with the model's chat template, every stop id (EOS plus end-of-turn
tokens) and the pad id. Callers take a `Codec`; `load_codec(path)` picks the class.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

Message = dict[str, str]
"""One chat message: {"role": "system" | "user" | "assistant" | "tool", "content": "..."}."""


@runtime_checkable
class Codec(Protocol):
    pad_id: int
    eos_id: int
    """The primary end-of-sequence id (the first of `stop_ids`)."""
    stop_ids: tuple[int, ...]
    """Every id that ends a completion: EOS and the chat template's end-of-turn tokens."""
    stop_strings: tuple[str, ...]
    """Text that ends a completion (checked on the decoded text); often empty."""
    is_chat: bool
    """True when prompts should be rendered with `encode_chat` (the model has a template)."""

    def encode(self, text: str) -> list[int]:
        """Plain text to ids (with BOS when the tokenizer adds one)."""
        ...

    def encode_chat(self, messages: Sequence[Message], *, add_generation_prompt: bool = True
                    ) -> list[int]:
        """Messages rendered with the model's chat template, generation prompt added."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Ids to text, up to the first stop id, cut before the first stop string;
        special tokens dropped."""
        ...

    def hits_stop_string(self, ids: Sequence[int]) -> bool:
        """Whether the text of `ids` (up to the first stop id) holds a stop string: what
        ends a completion in an engine that decodes as it generates."""
        ...

    def encode_tool_turn(self, output: str) -> list[int]:
        """The ids that follow a model turn ended at a tool call: they close the model's
        turn, show the tool's `output` and open the model's next turn. Plain
        `<tool>…</tool>` for the character codec; a message through the chat template
        for chat models."""
        ...


#: End-of-turn tokens of common chat templates. A completion ends at any of them that
#: the model's template uses, not only at EOS: an instruct model closes its turn
#: with e.g. `<|im_end|>` (ChatML), `<|eot_id|>` (Llama 3), `<|end|>` (Phi-3) or
#: `<end_of_turn>` (Gemma), and would otherwise ramble on into a made-up next turn.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>")


class HFCodec:
    """Any Hugging Face tokenizer, with the model's own chat template.

    Built from a version folder (`from_pretrained`), so every process holding the
    same version encodes the same prompt to the same ids. Slower than `CharCodec`
    (a Rust call per text, a Jinja render per chat prompt) and fine at the rates a
    real model generates.
    """

    def __init__(self, tokenizer: Any, *, generation_eos: Sequence[int] = (),
                 stop_strings: Sequence[str] = ()):
        """`tokenizer`: a loaded HF tokenizer. `generation_eos`: the ids the model's
        generation config names as EOS (they stop a completion too). `stop_strings`:
        extra text that ends a completion, e.g. a workload's answer delimiter."""
        self.tokenizer = tokenizer
        eos = tokenizer.eos_token_id
        if eos is None:
            eos = next(iter(generation_eos), None)
        if eos is None:
            raise ValueError("the tokenizer has no EOS token and generation_config.json names "
                             "no eos_token_id: nothing could end a completion")
        self.eos_id: int = int(eos)
        pad = tokenizer.pad_token_id
        # No pad token (common: Llama, Mistral): pad with EOS, as HF generate does.
        # Padding sits under the attention mask, so any valid id serves.
        self.pad_id: int = self.eos_id if pad is None else int(pad)
        template = tokenizer.chat_template or ""
        if isinstance(template, dict):  # named templates: the default one renders chats
            template = template.get("default", "")
        self.is_chat: bool = bool(template)
        vocab = tokenizer.get_vocab()
        turn_ends = [vocab[t] for t in END_OF_TURN_TOKENS if t in template and t in vocab]
        self.stop_ids: tuple[int, ...] = tuple(
            dict.fromkeys([self.eos_id, *turn_ends, *(int(i) for i in generation_eos)]))
        self.stop_strings: tuple[str, ...] = tuple(s for s in stop_strings if s)
        self._stops = frozenset(self.stop_ids)

    @classmethod
    def from_pretrained(cls, path: str | Path, *, stop_strings: Sequence[str] = ()) -> HFCodec:
        """The codec of a model folder: its tokenizer, chat template and the EOS ids of
        its generation_config.json (if any)."""
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(path))
        return cls(tok, generation_eos=_generation_eos(Path(path)), stop_strings=stop_strings)

    def encode(self, text: str) -> list[int]:
        """Plain text to ids, with the tokenizer's own special tokens (BOS when it adds one)."""
        return list(self.tokenizer.encode(text))

    def encode_chat(self, messages: Sequence[Message], *, add_generation_prompt: bool = True
                    ) -> list[int]:
        """Messages rendered with the model's chat template (which writes its own BOS);
        with `add_generation_prompt` the ids end with the assistant turn's opening,
        so the completion is the assistant's reply."""
        if not self.is_chat:
            raise ValueError("this tokenizer has no chat template: encode a plain prompt with "
                             "`encode`, or use an instruct model whose folder has one")
        out = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
            tokenize=True)
        # transformers 5 returns a BatchEncoding (a dict) here; 4.x returns the ids.
        if isinstance(out, Mapping):
            out = out["input_ids"]
        if out and isinstance(out[0], list):  # a batch of one
            (out,) = out
        return [int(i) for i in out]

    def decode(self, ids: Sequence[int]) -> str:
        """Ids to text, up to the first stop id; special tokens dropped; cut before the
        first stop string (as vLLM does with `stop`)."""
        end = next((k for k, i in enumerate(ids) if int(i) in self._stops), len(ids))
        text = self.tokenizer.decode([int(i) for i in ids[:end]], skip_special_tokens=True)
        for s in self.stop_strings:
            if (k := text.find(s)) >= 0:
                text = text[:k]
        return text

    def hits_stop_string(self, ids: Sequence[int]) -> bool:
        """Whether the text up to the first stop id holds a stop string (`decode` cuts it
        away, so an engine cannot look for it there)."""
        if not self.stop_strings:
            return False
        end = next((k for k, i in enumerate(ids) if int(i) in self._stops), len(ids))
        text = self.tokenizer.decode([int(i) for i in ids[:end]], skip_special_tokens=True)
        return any(s in text for s in self.stop_strings)


    def encode_tool_turn(self, output: str) -> list[int]:
        """The tool's output as a `user` message wrapped in `<tool>…</tool>`, rendered by
        the chat template after the model's (unclosed) turn, the next assistant turn
        opened. Why `user`: SmolLM2's template renders any role, but the model was tuned
        on system/user/assistant only. Rendered as text after a marker assistant message
        and tokenized without special-token additions, so what comes back is exactly
        the template's turn closing, the message and the generation prompt."""
        from astraflow.envs.base import TOOL_CLOSE, TOOL_OPEN

        if not self.is_chat:
            return [int(i) for i in self.tokenizer.encode(f"{TOOL_OPEN}{output}{TOOL_CLOSE}",
                                                          add_special_tokens=False)]
        marker = "\x00ASTRAFLOW-TURN\x00"
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker},
             {"role": "user", "content": f"{TOOL_OPEN}{output}{TOOL_CLOSE}"}],
            add_generation_prompt=True, tokenize=False)
        after = text[text.index(marker) + len(marker):]
        return [int(i) for i in self.tokenizer.encode(after, add_special_tokens=False)]


def _generation_eos(path: Path) -> list[int]:
    """generation_config.json's eos_token_id (an int or a list), if the folder has one."""
    f = path / "generation_config.json"
    if not f.is_file():
        return []
    eos = json.loads(f.read_text()).get("eos_token_id")
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(i) for i in eos]


def is_char_tokenizer(path: str | Path) -> bool:
    """Whether a folder's tokenizer is the tiny model's character vocabulary, read from
    tokenizer.json directly (no tokenizer is built)."""
    from astraflow.models.tokenizer import ALPHABETS, alphabet_vocab

    f = Path(path) / "tokenizer.json"
    if not f.is_file():
        return False
    model = json.loads(f.read_text()).get("model", {})
    return model.get("type") == "WordLevel" and any(
        model.get("vocab") == alphabet_vocab(a) for a in ALPHABETS)


def load_codec(path: str | Path, *, stop_strings: Sequence[str] = ()) -> Codec:
    """The codec of a version folder (or any HF model folder): `CharCodec` when the
    saved tokenizer is the tiny character vocabulary, `HFCodec` otherwise.
    `stop_strings` (HF only; the character codec has none) are extra text that ends a
    completion."""
    from astraflow.models.tokenizer import CharCodec

    if is_char_tokenizer(path):
        if stop_strings:
            raise ValueError("the character codec does not take stop strings")
        return CharCodec.from_pretrained(path)
    return HFCodec.from_pretrained(path, stop_strings=stop_strings)
