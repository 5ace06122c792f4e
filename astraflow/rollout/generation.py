"""What every engine returns and what the rollout worker needs of one.

`Engine` is the protocol the `hf` engine (engine.py) and the `vllm` engine
(vllm_engine.py) implement; `Generation` is their result, with the behaviour logprob
of every sampled token under exactly the distribution it was drawn from.
`generate_with_stops` gives any engine per-call stop strings (a multi-turn turn's end).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from astraflow.models.codec import Codec

STOP, LENGTH = "stop", "length"


class PromptTooLong(ValueError):
    """A prompt is longer than the flow's `rollout.max_prompt_tokens`."""


@dataclass
class Generation:
    completions: list[list[int]]  # token ids, ending with the stop id when the model stopped
    logprobs: list[list[float]]   # behaviour logprob of each completion token
    finish_reasons: list[str] = field(default_factory=list)
    """Per completion: `stop` (a stop id or stop string ended it) or `length`
    (it hit max_new_tokens: truncated)."""


def check_prompts(prompts: list[list[int]], max_prompt_tokens: int | None) -> None:
    """Refuse prompts over the limit before any compute, naming the longest."""
    if max_prompt_tokens is None or not prompts:
        return
    longest = max(len(p) for p in prompts)
    if longest > max_prompt_tokens:
        n = sum(len(p) > max_prompt_tokens for p in prompts)
        raise PromptTooLong(
            f"{n} prompt(s) exceed rollout.max_prompt_tokens={max_prompt_tokens} (longest: "
            f"{longest} tokens); raise the limit or shorten the workload's prompts")


class Engine(Protocol):
    """What the rollout worker needs of an engine (`hf`: HFEngine, `vllm`: VLLMEngine)."""

    def load_weights(self, path: Path) -> None: ...

    codec: Codec

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int,
                 samples_per_prompt: int = 1, temperature: float = 1.0, greedy: bool = False,
                 generator: torch.Generator | None = None,
                 max_prompt_tokens: int | None = None) -> Generation: ...


def stop_cut(codec: Codec, ids: Sequence[int], stop: Sequence[str]) -> int | None:
    """The length of the shortest prefix of `ids` whose text holds a string of `stop`
    (None: none does)."""
    if not stop or not any(x in codec.decode(ids) for x in stop):
        return None
    for k in range(1, len(ids) + 1):
        text = codec.decode(ids[:k])
        if any(x in text for x in stop):
            return k
    return None


def generate_with_stops(engine: Engine, prompts: list[list[int]], stop: Sequence[str],
                        **kwargs) -> Generation:
    """`engine.generate` with per-call stop strings on any engine.

    The hf engine stops at them itself (`stop=`). Others (vllm, which runs without a
    detokenizer) generate the whole turn; the completion is then cut right after the
    first stop string and marked `stop`. The cut keeps the distribution exact (every
    kept token was sampled with the same context, so its logprob stands) and costs
    only the tokens generated past the stop."""
    if not stop:
        return engine.generate(prompts, **kwargs)
    if "stop" in inspect.signature(engine.generate).parameters:
        out = engine.generate(prompts, stop=tuple(stop), **kwargs)
    else:
        out = engine.generate(prompts, **kwargs)
    for i, comp in enumerate(out.completions):
        k = stop_cut(engine.codec, comp, stop)
        if k is not None and (k < len(comp) or out.finish_reasons[i] != STOP):
            out.completions[i], out.logprobs[i] = comp[:k], out.logprobs[i][:k]
            out.finish_reasons[i] = STOP
    return out
