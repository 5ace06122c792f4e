"""Shared-base adapters on the `hf` engine: one frozen base, one LoRA adapter per policy.

    SharedAdapters: base weights (once) + peft adapters {solver, verifier, …}
        └── engine_for(solver) ─► AdapterEngine: generate = set adapter `solver`, decode
        └── engine_for(verifier) ─► AdapterEngine …

Policies whose `model.shared_base` names the same base (astraflow.config.model) are
served from one copy of it: each policy's adapter is a named peft adapter on it, at
that policy's own version, applied unmerged (no merged copy per policy). A reload
copies that policy's adapter tensors in place; the base and the other policies'
adapters are not touched. A policy still at version 0 (the base itself) generates with
the adapters disabled. Every base a policy names is checked to be the same weights
(sha256 of its safetensors), so one policy can never be served on another's base.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path

import torch

from astraflow.models import lora
from astraflow.models.codec import Codec, load_codec
from astraflow.models.hf import load_policy
from astraflow.rollout.engine import HFEngine
from astraflow.rollout.generation import Generation


class SharedAdapters:
    """One base model in this process and a named adapter per policy on it."""

    def __init__(self, base: Path, *, dtype: str = "auto"):
        base = Path(base)
        if lora.is_adapter(base):
            base = lora.base_dir(base)
        self.fingerprint = lora.fingerprint(base)
        self.model = load_policy(base, dtype=dtype)  # peft adapters are injected into it
        self.engine = HFEngine(self.model, load_codec(base))  # the decode loop
        self.peft: torch.nn.Module | None = None  # the PeftModel, once an adapter exists
        self.serving: dict[str, Path | None] = {}  # policy → its adapter folder (None: base)
        self._same: dict[Path, bool] = {base.resolve(): True}

    def engine_for(self, policy: str, path: Path) -> AdapterEngine:
        """The engine of `policy` on this base, at version folder `path`."""
        self.load(policy, path)
        return AdapterEngine(self, policy)

    def _check_base(self, policy: str, folder: Path) -> None:
        folder = folder.resolve()
        if folder not in self._same:
            self._same[folder] = lora.fingerprint(folder) == self.fingerprint
        if not self._same[folder]:
            raise ValueError(f"{policy}: {folder} is not the shared base this engine holds (its "
                             f"weights differ): policies sharing a base need the same version 0")

    @torch.no_grad()
    def load(self, policy: str, path: Path) -> None:
        """Serve `policy` at version folder `path`: its adapter (copied into its own
        tensors), or the base itself (a full version with the base's weights)."""
        path = Path(path)
        if not lora.is_adapter(path):
            self._check_base(policy, path)
            self.serving[policy] = None
            return
        self._check_base(policy, lora.base_dir(path))
        _, factors = lora.factors(path)  # refuses adapters that are not plain LoRA (peft
        # scales each by alpha / r from its config, as factors() does)
        config = lora.adapter_config(path)
        if self.peft is None or policy not in self.peft.peft_config:
            self.peft = lora.add_config(self.peft or self.model, config, policy)
        have = _lora_config(self.peft.peft_config[policy])
        if have != _lora_config(config):
            raise ValueError(f"{policy}: adapter {path} has {_lora_config(config)}, the one "
                             f"served has {have}: adapters cannot change shape mid-run")
        params = dict(self.peft.named_parameters())
        want = {k for k in params if f".lora_A.{policy}." in k or f".lora_B.{policy}." in k}
        seen = set()
        for weight, (a, b) in factors.items():
            module = weight.removesuffix(".weight")
            for kind, t in (("A", a), ("B", b)):
                key = f"base_model.model.{module}.lora_{kind}.{policy}.weight"
                if key not in params or params[key].shape != t.shape:
                    raise RuntimeError(f"adapter {path}: {module}.lora_{kind} {tuple(t.shape)} "
                                       f"does not fit this model")
                params[key].copy_(t)
                seen.add(key)
        if seen != want:
            raise RuntimeError(f"adapter {path} lacks {sorted(want - seen)[:4]}")
        self.serving[policy] = path

    def generate(self, policy: str, prompts: list[list[int]], **kwargs) -> Generation:
        """Generate as `policy`: its adapter alone active, or none at version 0."""
        if policy not in self.serving:
            raise KeyError(f"{policy} is not served by this engine: engine_for() first")
        if self.serving[policy] is None:
            off = self.peft.disable_adapter() if self.peft is not None \
                else contextlib.nullcontext()
            with off:
                return self.engine.generate(prompts, **kwargs)
        assert self.peft is not None
        self.peft.set_adapter(policy, inference_mode=True)
        self.model.eval()
        return self.engine.generate(prompts, **kwargs)

    def base_parameters(self) -> list[torch.nn.Parameter]:
        """The base's parameters (every one not an adapter's): held once."""
        return [p for n, p in self.model.named_parameters() if ".lora_" not in n]


def _lora_config(config) -> tuple:
    return (config.r, float(config.lora_alpha), sorted(config.target_modules))


class AdapterEngine:
    """One policy's engine on a `SharedAdapters` (the `Engine` the worker holds)."""

    def __init__(self, shared: SharedAdapters, policy: str):
        self.shared, self.policy = shared, policy
        self.codec: Codec = shared.engine.codec

    def load_weights(self, path: Path) -> None:
        """Swap in this policy's new version: only its adapter tensors change."""
        self.shared.load(self.policy, path)

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int,
                 samples_per_prompt: int = 1, temperature: float = 1.0, greedy: bool = False,
                 generator: torch.Generator | None = None, max_prompt_tokens: int | None = None,
                 stop: Sequence[str] = ()) -> Generation:
        """`HFEngine.generate` as this policy."""
        return self.shared.generate(
            self.policy, prompts, max_new_tokens=max_new_tokens,
            samples_per_prompt=samples_per_prompt, temperature=temperature, greedy=greedy,
            generator=generator, max_prompt_tokens=max_prompt_tokens, stop=stop)

