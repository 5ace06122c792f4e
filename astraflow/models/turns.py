"""Conversations as token ids, with the model's own chat template.

Shared by the OpenAI-compatible endpoint (`astraflow.rollout.endpoint`) and by workflows
that play several turns in one row (the blind judge): both must extend a model turn's
exact ids with what comes next, as the template would render it, so a trained row
holds the tokens the model saw. A model without a template (the tiny character model,
a base model) reads plain text, tool output wrapped in `<tool>…</tool>`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from astraflow.models.codec import Codec

TOOL_OPEN, TOOL_CLOSE = "<tool>", "</tool>"
_MARKER = "\x00ASTRAFLOW-TURN\x00"


def plain(messages: Sequence[dict[str, str]]) -> str:
    """What a model without a chat template reads: the contents in order, tool output
    wrapped in `<tool>…</tool>`."""
    return "".join(f"{TOOL_OPEN}{m['content']}{TOOL_CLOSE}" if m["role"] == "tool"
                   else m["content"] for m in messages)


def no_bos(codec: Codec, text: str) -> list[int]:
    """`text`'s ids with no BOS: it continues a sequence, never starts one."""
    tok = getattr(codec, "tokenizer", None)
    if tok is not None:
        return [int(i) for i in tok.encode(text, add_special_tokens=False)]
    ids = codec.encode(text)
    bos = getattr(codec, "bos_id", None)
    return ids[1:] if ids and ids[0] == bos else ids


def render(codec: Codec, messages: list[dict[str, str]]) -> list[int]:
    """The prompt ids of a whole conversation, the assistant's turn opened."""
    if not codec.is_chat:
        return codec.encode(plain(messages))
    return codec.encode_chat(messages)


def continuation(codec: Codec, after: list[int], messages: list[dict[str, str]]) -> list[int]:
    """The ids that follow a model turn `after` (its completion ids) when `messages`
    come next: the template's turn closing, the messages, the next turn's opening.
    Rendered behind a marker assistant message, as `encode_tool_turn` does; when the
    model's turn already ended with the template's end-of-turn token, it is not
    repeated."""
    if not codec.is_chat:
        return no_bos(codec, plain(messages))
    tok: Any = getattr(codec, "tokenizer", None)  # HFCodec: chat codecs have one
    text = tok.apply_chat_template(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": _MARKER},
         *messages], add_generation_prompt=True, tokenize=False)
    ids = no_bos(codec, text[text.index(_MARKER) + len(_MARKER):])
    if after and ids and after[-1] in codec.stop_ids and ids[0] == after[-1]:
        ids = ids[1:]
    return ids
