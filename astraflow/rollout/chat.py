"""OpenAI chat messages ⇄ token ids, for the endpoint (endpoint.py).

Messages are rendered with the model's own chat template; a model without one (the
tiny character model, a base model) reads them as plain text, tool output wrapped in
`<tool>…</tool>`. Tools are listed in a system message and called as
`<tool_call>{"name": …, "arguments": {…}}</tool_call>` (the Hermes/Qwen format), for
every model alike: a template's own tool support differs per model and most small
models have none. The ids themselves (`render`, `continuation`, `no_bos`) come from
`astraflow.models.turns`, which the multi-turn workflows use too.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from typing import Any

from astraflow.models.codec import Codec

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.S)


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


def vocab_size(codec: Codec) -> int:
    """Token ids a prompt may use: the tokenizer's (HF) or the alphabet's (tiny model)."""
    tok = getattr(codec, "tokenizer", None)
    vocab = tok if tok is not None else getattr(codec, "vocab", None)
    if vocab is None:
        raise TypeError(f"{type(codec).__name__} has neither a tokenizer nor a vocab")
    return len(vocab)


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
