"""The OpenAI-compatible API of an endpoint worker (serving.py runs it).

    POST /v1/chat/completions, /v1/completions     a call; a new episode per call unless
         (or /episodes/{E}/v1/…, or header X-Episode-Id: E)   it names one
    POST /episodes/{E}/reward  {"reward": r, "group"?: g, "task"?: t}   ends episode E
    GET  /v1/models, /health

An agent sets `base_url` to `…/episodes/{E}/v1` and changes nothing else. Sampling
follows the flow (`rollout.temperature`): the logprobs the trainer divides by are
taken at that temperature, so a request may name only that temperature, or 0 (greedy:
served, never recorded — for evaluation). Errors are OpenAI's shape,
`{"error": {"message", "type", "param", "code"}}`, with its status codes.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
import uuid
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from astraflow.models.turns import continuation, no_bos, render
from astraflow.rollout.chat import (
    CALL_CLOSE,
    BadRequest,
    flatten,
    parse_calls,
    same_reply,
    vocab_size,
    with_tools,
)
from astraflow.rollout.episodes import Ended, Plan, Unknown
from astraflow.rollout.generation import LENGTH, PromptTooLong

if TYPE_CHECKING:
    from astraflow.rollout.serving import Served

#: Request fields that would change the sampling distribution away from the flow's.
UNSUPPORTED = {"top_p": 1, "presence_penalty": 0, "frequency_penalty": 0, "n": 1,
               "stream": False, "echo": False, "best_of": 1}


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.type, self.param, self.code = status, type_, param, code

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": str(self), "type": self.type,
                                       "param": self.param, "code": self.code}}, self.status)


def make_app(served: Served) -> FastAPI:
    app = FastAPI(title="AstraFlow endpoint", docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def bearer(request: Request, call_next):
        if served.token and not hmac.compare_digest(
                request.headers.get("authorization", "").encode(),
                f"Bearer {served.token}".encode()):
            return ApiError(401, "missing or wrong bearer token (Authorization: Bearer …)",
                            code="invalid_api_key").response()
        return await call_next(request)

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, err: ApiError) -> JSONResponse:
        return err.response()

    @app.exception_handler(Exception)
    async def server_error(_request: Request, err: Exception) -> JSONResponse:
        return ApiError(500, f"{type(err).__name__}: {err}", "server_error").response()

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, err: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code)
        return ApiError(err.status_code, str(err.detail), code=code).response()

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "versions": dict(served.worker.versions),
                "open_episodes": served.book.open_count(),
                "episodes_dropped": served.book.dropped, "rows_written": served.rows_written}

    @app.get("/v1/models")
    @app.get("/episodes/{episode}/v1/models")
    async def models(episode: str | None = None) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": p, "object": "model", "created": 0,
                                            "owned_by": "astraflow"} for p in served.policies]}

    @app.post("/v1/chat/completions")
    @app.post("/episodes/{episode}/v1/chat/completions")
    async def chat(request: Request, episode: str | None = None) -> JSONResponse:
        return await _call(served, request, episode, "chat")

    @app.post("/v1/completions")
    @app.post("/episodes/{episode}/v1/completions")
    async def completions(request: Request, episode: str | None = None) -> JSONResponse:
        return await _call(served, request, episode, "completions")

    @app.post("/episodes/{episode}/reward")
    async def reward(request: Request, episode: str) -> dict[str, Any]:
        body = await _body(request)
        r = body.get("reward")
        if isinstance(r, bool) or not isinstance(r, int | float) or not math.isfinite(r):
            raise ApiError(400, "reward must be a finite number", param="reward")
        group, task = body.get("group"), body.get("task")
        for name, v in (("group", group), ("task", task)):
            if v is not None and not isinstance(v, str):
                raise ApiError(400, f"{name} must be a string", param=name)
        try:
            rows = served.book.reward(episode, float(r), group, task)
        except Unknown:
            dropped = served.book.ended.get(episode) == "dropped"
            why = ("it was dropped: no reward within rollout.endpoint.reward_timeout_s"
                   if dropped else "it made no recorded call")
            raise ApiError(404, f"no open episode {episode!r}: {why}",
                           code="episode_not_found") from None
        except Ended as err:
            raise ApiError(409, str(err), code="episode_ended") from None
        return {"episode": episode, "rows": rows}

    return app


async def _body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(400, f"the body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def _sampling(served: Served, body: dict[str, Any]) -> tuple[int, bool, tuple[str, ...]]:
    """(max_tokens, greedy, stop) of a request; refuses what the flow cannot sample."""
    for name, ok in UNSUPPORTED.items():
        if body.get(name) not in (None, ok):
            raise ApiError(400, f"{name}={body[name]!r} is not supported: the endpoint samples "
                           f"the flow's distribution (only {name}={ok!r})", param=name)
    if body.get("logit_bias"):
        raise ApiError(400, "logit_bias is not supported", param="logit_bias")
    if body.get("top_logprobs"):
        raise ApiError(400, "top_logprobs is not supported (logprobs of the sampled tokens "
                       "are)", param="top_logprobs")
    flow_t = served.ctx.flow.rollout.temperature
    t = body.get("temperature")
    if t is not None and (not isinstance(t, int | float) or (t != 0 and not
                                                             math.isclose(t, flow_t))):
        raise ApiError(400, f"temperature must be the flow's rollout.temperature ({flow_t}), "
                       f"which the trainer's logprobs use, or 0 (greedy, not recorded)",
                       param="temperature")
    cap = served.spec.max_tokens
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"
    n = body.get(name)
    if n is None:
        n = cap
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= cap:
        raise ApiError(400, f"{name} must be an integer from 1 to {cap} "
                       f"(rollout.endpoint.max_tokens)", param=name)
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else (stop or [])
    if not isinstance(stops, list) or len(stops) > 4 or not all(
            isinstance(s, str) and s for s in stops):
        raise ApiError(400, "stop must be a string or a list of up to 4 strings", param="stop")
    return n, t == 0, tuple(stops)


def _model(served: Served, body: dict[str, Any]) -> str:
    model = body.get("model")
    if model not in served.policies:
        raise ApiError(404 if isinstance(model, str) else 400,
                       f"model {model!r} does not exist here: one of {served.policies} (the "
                       f"flow's policies)", param="model", code="model_not_found")
    return model


def _plan_chat(served: Served, episode: str, policy: str, messages: list, flat: list,
               tools: list, record: bool) -> Plan:
    codec = served.codec
    row = served.book.open_row(episode, policy) if record else None
    if row is not None and row.api == "chat":
        last, n = row.last, len(row.last["flat"])
        if (last["tools"] == tools and len(flat) > n and flat[:n] == last["flat"]
                and same_reply(messages[n], last["reply"])):
            new = continuation(codec, row.segments[-1][0], flat[n + 1:])
            return Plan(row.context() + new, row, new, row.context_len())
    return Plan(render(codec, with_tools(flat, tools)))


def _plan_text(served: Served, episode: str, policy: str, prompt: Any, record: bool
               ) -> tuple[Plan, str | None]:
    codec = served.codec
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        text, ids = prompt, None
    elif (isinstance(prompt, list) and prompt
          and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size(codec)
                  for i in prompt)):
        text, ids = None, [int(i) for i in prompt]
    else:
        raise ApiError(400, f"prompt must be one string or one list of token ids (each below "
                       f"the vocabulary's {vocab_size(codec)})", param="prompt")
    row = served.book.open_row(episode, policy) if record else None
    if row is not None and row.api == "completions":
        base = row.context()
        if ids is not None and ids[: len(base)] == base:
            return Plan(ids, row, ids[len(base):], len(base)), None
        last = row.last.get("text")
        if text is not None and last is not None and text.startswith(last):
            new = no_bos(codec, text[len(last):]) if len(text) > len(last) else []
            return Plan(base + new, row, new, len(base)), text
    return Plan(ids if ids is not None else codec.encode(text)), text


async def _call(served: Served, request: Request, episode: str | None, api: str
                ) -> JSONResponse:
    body = await _body(request)
    policy = _model(served, body)
    max_tokens, greedy, stops = _sampling(served, body)
    episode = episode or request.headers.get("x-episode-id") or uuid.uuid4().hex
    record = not greedy
    tools: list = []
    try:
        if api == "chat":
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ApiError(400, "messages must be a non-empty list", param="messages")
            tools = body.get("tools") or []
            if not isinstance(tools, list):
                raise ApiError(400, "tools must be a list", param="tools")
            if body.get("tool_choice") not in (None, "auto", "none"):
                raise ApiError(400, "tool_choice must be auto or none", param="tool_choice")
            if body.get("tool_choice") == "none":
                tools = []
            flat = flatten(messages)
            with_tools(flat, tools)  # checks the tools
            plan = _plan_chat(served, episode, policy, messages, flat, tools, record)
        else:
            plan, text = _plan_text(served, episode, policy, body.get("prompt"), record)
    except BadRequest as err:
        raise ApiError(400, str(err), param=err.param) from None
    except Ended as err:
        raise ApiError(409, str(err), code="episode_ended") from None
    while policy not in served.open:  # backpressure: the trainer is behind
        await asyncio.sleep(0.05)
    stop = stops + ((CALL_CLOSE,) if tools else ())
    try:
        ids, lps, why, version = await asyncio.wrap_future(
            served.submit(policy, plan.ids, max_tokens, greedy, stop))
    except PromptTooLong as err:
        raise ApiError(400, str(err), param="messages" if api == "chat" else "prompt",
                       code="context_length_exceeded") from None
    out = served.codec.decode(ids)
    for s in stops:  # OpenAI leaves a request's stop string out of the text
        if (k := out.find(s)) >= 0:
            out = out[:k]
    finish = "length" if why == LENGTH else "stop"
    content, calls = parse_calls(out, tools)
    reply: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
    if calls:
        reply["tool_calls"], finish = calls, "tool_calls"
    last = ({"flat": flat, "tools": tools, "reply": reply} if api == "chat"
            else {"text": None if text is None else text + out})
    stitched = False
    if record:
        try:
            row = served.book.record(episode, plan, ids, lps, version, finish, policy, api, last)
        except Ended as err:
            raise ApiError(409, str(err), code="episode_ended") from None
        stitched = row is plan.row
    usage = {"prompt_tokens": len(plan.ids), "completion_tokens": len(ids),
             "total_tokens": len(plan.ids) + len(ids)}
    meta = {"episode": episode, "version": version, "recorded": record, "stitched": stitched}
    created = int(time.time())
    if api == "chat":
        logprobs = None
        if body.get("logprobs"):
            logprobs = {"content": [
                {"token": (t := served.codec.decode([i])), "logprob": lp,
                 "bytes": list(t.encode()), "top_logprobs": []} for i, lp in zip(ids, lps, strict=True)]}
        choice = {"index": 0, "message": reply, "logprobs": logprobs, "finish_reason": finish}
        data = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                "created": created, "model": policy, "choices": [choice], "usage": usage,
                "astraflow": meta}
    else:
        logprobs = None
        if body.get("logprobs") is not None:
            logprobs = {"tokens": [served.codec.decode([i]) for i in ids],
                        "token_logprobs": lps, "top_logprobs": None, "text_offset": None}
        choice = {"index": 0, "text": out, "logprobs": logprobs, "finish_reason": finish}
        data = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "created": created, "model": policy, "choices": [choice], "usage": usage,
                "astraflow": meta}
    return JSONResponse(data, headers={"X-Episode-Id": episode})
