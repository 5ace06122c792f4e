"""OpenAI chat messages ⇄ token ids, for the endpoint (endpoint.py).

Messages are rendered with the model's own chat template; a model without one (the
tiny character model, a base model) reads them as plain text, tool output wrapped in
`<tool>…</tool>`. Tools are listed in a system message and called as
`<tool_call>{"name": …, "arguments": {…}}</tool_call>` (the Hermes/Qwen format), for
every model alike: a template's own tool support differs per model and most small
models have none. `continuation` renders messages that follow a model turn as the
template would, so a later call can extend the exact ids of the earlier one.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from typing import Any

from astraflow.models.codec import Codec

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_OPEN, TOOL_CLOSE = "<tool>", "</tool>"
_CALL = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.S)
_MARKER = "\x00ASTRAFLOW-TURN\x00"


class BadRequest(ValueError):
    """A request the endpoint refuses: OpenAI's `invalid_request_error` with `param`."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def text_of(content: Any, param: str) -> str:
    """A message's content as text: a string, None, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise BadRequest("only text content parts are supported", param)
            out.append(str(part.get("text", "")))
        return "".join(out)
    raise BadRequest("content must be a string or a list of text parts", param)


def call_text(calls: Sequence[dict[str, Any]]) -> str:
    """An assistant message's tool calls as the model writes them."""
    out = []
    for c in calls:
        fn = c.get("function") or {}
        args = fn.get("arguments", "{}")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            pass  # kept as the string the agent sent
        out.append(f"{CALL_OPEN}{json.dumps({'name': fn.get('name'), 'arguments': args})}"
                   f"{CALL_CLOSE}")
    return "".join(out)


def flatten(messages: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """Messages as {role, content} strings: tool calls become text, tool output stays
    a `tool` message. Refuses malformed ones, naming the message."""
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user",
                                                              "assistant", "tool"):
            raise BadRequest("each message needs a role: system, developer, user, assistant "
                             "or tool", f"messages[{i}].role")
        text = text_of(m.get("content"), f"messages[{i}].content")
        if m["role"] == "assistant" and m.get("tool_calls"):
            text += call_text(m["tool_calls"])
        role = "system" if m["role"] == "developer" else m["role"]
        out.append({"role": role, "content": text})
    return out


def tool_listing(tools: Sequence[dict[str, Any]]) -> str:
    """The system text that offers `tools` and says how to call them."""
    specs = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if (not isinstance(fn, dict) or t.get("type") != "function"
                or not isinstance(fn.get("name"), str)):
            raise BadRequest("each tool is {type: function, function: {name, description?, "
                             "parameters?}}", f"tools[{i}]")
        specs.append(json.dumps({k: fn[k] for k in ("name", "description", "parameters")
                                 if k in fn}))
    return ("You may call these tools:\n" + "\n".join(specs) + "\nTo call one, reply with "
            f'{CALL_OPEN}{{"name": NAME, "arguments": {{...}}}}{CALL_CLOSE}')


def with_tools(messages: list[dict[str, str]], tools: Sequence[dict[str, Any]]
               ) -> list[dict[str, str]]:
    """`messages` with the tool listing in the (first) system message."""
    if not tools:
        return messages
    listing = tool_listing(tools)
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{listing}"},
                *messages[1:]]
    return [{"role": "system", "content": listing}, *messages]


def _plain(messages: Sequence[dict[str, str]]) -> str:
    """What a model without a chat template reads: the contents in order, tool output
    wrapped in `<tool>…</tool>`."""
    return "".join(f"{TOOL_OPEN}{m['content']}{TOOL_CLOSE}" if m["role"] == "tool"
                   else m["content"] for m in messages)


def no_bos(codec: Codec, text: str) -> list[int]:
    tok = getattr(codec, "tokenizer", None)
    if tok is not None:
        return [int(i) for i in tok.encode(text, add_special_tokens=False)]
    ids = codec.encode(text)
    bos = getattr(codec, "bos_id", None)
    return ids[1:] if ids and ids[0] == bos else ids


def vocab_size(codec: Codec) -> int:
    """Token ids a prompt may use: the tokenizer's (HF) or the alphabet's (tiny model)."""
    tok = getattr(codec, "tokenizer", None)
    vocab = tok if tok is not None else getattr(codec, "vocab", None)
    if vocab is None:
        raise TypeError(f"{type(codec).__name__} has neither a tokenizer nor a vocab")
    return len(vocab)


def render(codec: Codec, messages: list[dict[str, str]]) -> list[int]:
    """The prompt ids of a whole conversation, the assistant's turn opened."""
    if not codec.is_chat:
        return codec.encode(_plain(messages))
    return codec.encode_chat(messages)


def continuation(codec: Codec, after: list[int], messages: list[dict[str, str]]) -> list[int]:
    """The ids that follow a model turn `after` (its completion ids) when `messages`
    come next: the template's turn closing, the messages, the next turn's opening.
    Rendered behind a marker assistant message, as `encode_tool_turn` does; when the
    model's turn already ended with the template's end-of-turn token, it is not
    repeated."""
    if not codec.is_chat:
        return no_bos(codec, _plain(messages))
    tok: Any = getattr(codec, "tokenizer", None)  # HFCodec: chat codecs have one
    text = tok.apply_chat_template(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": _MARKER},
         *messages], add_generation_prompt=True, tokenize=False)
    ids = no_bos(codec, text[text.index(_MARKER) + len(_MARKER):])
    if after and ids and after[-1] in codec.stop_ids and ids[0] == after[-1]:
        ids = ids[1:]
    return ids


def parse_calls(text: str, tools: Sequence[dict[str, Any]]
                ) -> tuple[str, list[dict[str, Any]]]:
    """(content, tool_calls) of a model turn: every well-formed `<tool_call>` naming an
    offered tool becomes an OpenAI tool call; content is the text before the first.
    A turn with none (or only malformed ones) is plain content, the agent's to judge."""
    if not tools:
        return text, []
    names = {t["function"]["name"] for t in tools}
    calls = []
    for m in _CALL.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or obj.get("name") not in names:
            continue
        args = obj.get("arguments", {})
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": obj["name"],
                                   "arguments": args if isinstance(args, str)
                                   else json.dumps(args)}})
    if not calls:
        return text, []
    return text[: text.index(CALL_OPEN)], calls


def same_reply(sent: dict[str, Any], returned: dict[str, Any]) -> bool:
    """Whether an assistant message the agent sends back is the reply the endpoint
    returned: same text, same calls (names and arguments as JSON; call ids and
    key order may differ)."""
    if sent.get("role") != "assistant":
        return False
    try:
        text = text_of(sent.get("content"), "content")
    except BadRequest:
        return False

    def calls(m: dict[str, Any]) -> list[tuple[Any, Any]]:
        out = []
        for c in m.get("tool_calls") or []:
            fn = (c or {}).get("function") or {}
            args = fn.get("arguments")
            try:
                args = json.loads(args) if isinstance(args, str) else args
            except json.JSONDecodeError:
                pass
            out.append((fn.get("name"), args))
        return out

    return text == (returned.get("content") or "") and calls(sent) == calls(returned)
