"""LoRA policies: adapters trained on a frozen base, published as adapters only.

    version 0 (full weights, never pruned) ◄──base.json── v1, v2, … (adapter only)
         └──► trainer: base + trainable adapters (peft)
         └──► hf engine: base weights + (alpha / r) * B @ A, merged in place
         └──► vllm engine: base model + LoRARequest(adapter folder)

Why: an 8B policy's version is 16 GB, its rank-16 adapter tens of MB, so publishing,
mirroring and worker reloads cost the adapter. An adapter is meaningless without its
exact base, so each adapter version names it (`base.json`: version 0, never pruned)
and is read from a folder beside it. A folder is an adapter exactly when it holds
`adapter_config.json` (and no `config.json`). peft is imported only where adapters
are built or trained; merging reads the safetensors directly (engines need torch only).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open

from astraflow.models.weights import load_weights_into
from astraflow.stores.manifest import MANIFEST, sha256_file

if TYPE_CHECKING:
    from astraflow.config.model import LoraSpec

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_FILE = "base.json"
#: The version every adapter applies to: a policy's version 0 is its pretrained (or
#: warm-started) model, the one version the weight store never prunes.
BASE_VERSION = 0
_VERSION_DIR = re.compile(r"v(\d{8})")
#: peft's key of a LoRA factor: `base_model.model.<module>.lora_{A,B}.weight`.
_LORA_KEY = re.compile(r"^base_model\.model\.(.+)\.lora_([AB])\.weight$")


def is_adapter(path: str | Path) -> bool:
    """Whether a version folder holds an adapter (rather than whole weights)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def is_peft(model: torch.nn.Module) -> bool:
    """Whether a model carries peft adapters (without importing peft)."""
    return hasattr(model, "peft_config")


def version_dir(version: int) -> str:
    """A version's folder name in the weight store (`WeightStore._rel`)."""
    return f"v{version:08d}"


def base_version(path: str | Path) -> int:
    """The version an adapter folder applies to (its `base.json`)."""
    f = Path(path) / BASE_FILE
    if not f.is_file():
        raise FileNotFoundError(f"{path} is an adapter without {BASE_FILE}: it names no base, "
                                f"so it cannot be applied")
    return int(json.loads(f.read_text())["version"])


def base_dir(path: str | Path) -> Path:
    """The base model folder of an adapter folder: its sibling `v<base>` (the weight
    store and its S3 download cache both keep a policy's versions side by side)."""
    path = Path(path)
    d = path.parent / version_dir(base_version(path))
    if not (d / "config.json").is_file():
        raise FileNotFoundError(f"the base of adapter {path} ({d.name}) is not at {d}: load it "
                                f"through the weight store, which fetches the base with it")
    return d


def _peft():
    """peft, or an ImportError that says how to get it."""
    try:
        import peft
    except ImportError as err:
        raise ImportError("model.lora trains adapters with peft, which is not installed: "
                          "pip install 'astraflow[lora]'") from err
    return peft


def lora_config(spec: LoraSpec):
    """peft's LoraConfig for the flow's `model.lora`."""
    LoraConfig = _peft().LoraConfig  # noqa: N806

    return LoraConfig(r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                      target_modules=list(spec.target_modules), bias="none",
                      task_type="CAUSAL_LM")


def wrap(model: torch.nn.Module, spec: LoraSpec, source: str | Path | None = None, *,
         seed: int = 0, name: str = "default") -> torch.nn.Module:
    """Fresh adapters on a full model (B = 0: the wrapped model computes exactly what
    the base does); only the adapters require grad. A's random init is drawn from
    `seed`, not the global RNG, so a run starts from the same adapters whatever ran
    before it (and the global RNG is left as it was). `source`: the folder the model
    came from; adapters must start on the base their versions will name. `name`: the
    adapter's name; on a peft model (a shared base) it is added beside the others."""
    if source is not None and (m := _VERSION_DIR.fullmatch(Path(source).name)) \
            and int(m.group(1)) != BASE_VERSION:
        raise ValueError(f"LoRA adapters start on version {BASE_VERSION} of a policy (the base "
                         f"every adapter version names); {source} is a later full version. Turn "
                         f"model.lora on for a fresh run, or off to continue full fine-tuning")
    return add_config(model, lora_config(spec), name, seed=seed)


def adapter_config(path: str | Path):
    """peft's LoraConfig of an adapter folder (its adapter_config.json), naming no base
    folder (the caller checks the base itself; peft would only warn of the name)."""
    config = _peft().LoraConfig.from_pretrained(str(path))
    config.base_model_name_or_path = None
    return config


def add_config(model: torch.nn.Module, config, name: str, *, seed: int = 0) -> torch.nn.Module:
    """Adapters `name` (peft config `config`) on `model`, which becomes a peft model on
    the first; returns the peft model. A is drawn from `seed` (as `wrap` draws it)."""
    with torch.random.fork_rng():  # CPU and every CUDA device
        torch.manual_seed(seed)
        if is_peft(model):
            model.add_adapter(name, config)
            return model
        return _peft().get_peft_model(model, config, adapter_name=name)


def load_trainable(model: torch.nn.Module, path: str | Path, spec: LoraSpec, *,
                   name: str = "default") -> torch.nn.Module:
    """The base `model` with the adapters of version folder `path`, trainable. On a
    peft model already (a shared base), they are added to it as adapter `name`."""
    PeftModel = _peft().PeftModel  # noqa: N806

    saved = json.loads((Path(path) / ADAPTER_CONFIG).read_text())
    want = lora_config(spec)
    got = (saved["r"], float(saved["lora_alpha"]), sorted(saved["target_modules"]))
    if got != (want.r, float(want.lora_alpha), sorted(want.target_modules)):
        raise ValueError(f"the adapter at {path} has r={got[0]}, alpha={got[1]}, targets "
                         f"{got[2]}; the flow's model.lora asks r={want.r}, alpha="
                         f"{want.lora_alpha}, targets {sorted(want.target_modules)}: adapters "
                         f"cannot change shape mid-run")
    if is_peft(model):
        model.load_adapter(str(path), adapter_name=name, is_trainable=True)
        return model
    return PeftModel.from_pretrained(model, str(path), adapter_name=name, is_trainable=True)


def save_adapter(model: torch.nn.Module, path: str | Path, name: str | None = None) -> None:
    """Write the adapters of a peft model (adapter_model.safetensors and
    adapter_config.json; no base weights) and the pointer to their base. `name`: which
    adapter, when the model holds several (a shared base); default its only one."""
    from safetensors.torch import save_file

    path = Path(path)
    # What peft's save_pretrained writes for a LoRA without bias (factors keyed without
    # the adapter name), minus its model card and checks, which took ~1 s a version.
    name = _adapter_name(model) if name is None else name
    tensors = {key.replace(f".{name}.", "."): value.detach().contiguous()
               for key, value in adapter_state(model, name).items()}
    save_file(tensors, str(path / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    model.peft_config[name].save_pretrained(str(path))
    config = json.loads((path / ADAPTER_CONFIG).read_text())
    # The folder the trainer's base came from means nothing elsewhere: name the base
    # version, so identical adapters hash identically on every machine.
    config["base_model_name_or_path"] = version_dir(BASE_VERSION)
    (path / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (path / BASE_FILE).write_text(json.dumps({"version": BASE_VERSION}) + "\n")


def adapter_state(model: torch.nn.Module, name: str) -> dict[str, torch.Tensor]:
    """Adapter `name`'s factors in a peft model's state dict (keys as peft names them)."""
    return {k: v for k, v in model.state_dict().items()
            if k.endswith(f".{name}.weight") and (".lora_A." in k or ".lora_B." in k)}


def fingerprint(folder: str | Path) -> dict[str, str]:
    """What a base's weights are: {file: sha256} of a full version folder's safetensors,
    read from its weight-store manifest (hashed here when it has none). Two policies'
    versions 0 with equal fingerprints are one base, so one copy can serve both."""
    folder = Path(folder)
    manifest = folder / MANIFEST
    if manifest.is_file():
        files = json.loads(manifest.read_text())["files"]
        out = {n: f["sha256"] for n, f in files.items() if n.endswith(".safetensors")}
    else:
        out = {p.name: sha256_file(p) for p in folder.glob("*.safetensors")}
    if not out:
        raise FileNotFoundError(f"{folder} holds no safetensors weights: not a full version")
    return out


def _adapter_name(model: torch.nn.Module) -> str:
    names = list(model.peft_config)
    if len(names) != 1:
        raise ValueError(f"a policy trains one adapter; this model has {names}")
    return names[0]


def factors(path: str | Path) -> tuple[float, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """An adapter folder's merge: `(scale, {<module>.weight: (A, B)})`, so that the
    weight becomes W + scale * B @ A (scale = alpha / r), exactly peft's merge of a
    plain LoRA. Adapter variants whose merge differs (DoRA, rsLoRA scaling,
    transposed fan_in_fan_out weights) are refused rather than merged wrongly."""
    path = Path(path)
    cfg = json.loads((path / ADAPTER_CONFIG).read_text())
    odd = [k for k in ("use_dora", "use_rslora", "fan_in_fan_out") if cfg.get(k)]
    if odd or cfg.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{path}: {cfg.get('peft_type')} adapter with {odd} set; only plain "
                         f"LoRA adapters (as the trainer writes) can be merged")
    found: dict[str, dict[str, torch.Tensor]] = {}
    with safe_open(str(path / ADAPTER_WEIGHTS), framework="pt") as st:
        for key in st.keys():
            m = _LORA_KEY.match(key)
            if m is None:
                raise ValueError(f"{path}: unexpected tensor {key} in {ADAPTER_WEIGHTS} (only "
                                 f"lora_A/lora_B factors can be merged)")
            found.setdefault(m.group(1), {})[m.group(2)] = st.get_tensor(key)
    out = {}
    for module, ab in found.items():
        if set(ab) != {"A", "B"}:
            raise ValueError(f"{path}: {module} has lora_{''.join(ab)} only")
        out[f"{module}.weight"] = (ab["A"], ab["B"])
    return float(cfg["lora_alpha"]) / float(cfg["r"]), out


class MergedAdapter:
    """Holds a plain model at base + one adapter, merged into the weights.

    The targeted base weights are kept aside, in CPU memory (a copy of those
    tensors only; with every projection adapted that is most of the model), so
    the next version's adapter merges onto the exact base, not onto the previous
    merge: no drift over hundreds of versions (subtracting the old B @ A in
    bfloat16 would round differently each time), and a version swap reads the
    adapter's bytes, not the model's. vLLM workers need none of this: they serve
    adapters unmerged."""

    def __init__(self) -> None:
        self.base: Path | None = None
        self.saved: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def apply(self, model: torch.nn.Module, path: str | Path, *, base_loaded: bool = False
              ) -> None:
        """Set `model` to the base of `path` plus its adapter. `base_loaded`: the
        model holds exactly that base already (it was just loaded from it)."""
        bdir = base_dir(path).resolve()
        if bdir != self.base:
            if not base_loaded:
                load_weights_into(model, bdir)
            self.base, self.saved = bdir, {}
        params = model.state_dict(keep_vars=True)
        scale, add = factors(path)
        missing = sorted(set(add) - set(params))
        if missing:
            raise RuntimeError(f"adapter {path} targets weights the model lacks: {missing[:5]}")
        for name, base in self.saved.items():  # the previous adapter's targets back to base
            if name not in add:
                params[name].copy_(base)
        for name, (a, b) in add.items():
            target = params[name]
            if (b.shape[0], a.shape[1]) != tuple(target.shape):
                raise RuntimeError(f"adapter {path}: {name} is {b.shape[0]}x{a.shape[1]}, the "
                                   f"weight {tuple(target.shape)}")
            base = self.saved.get(name)
            if base is None:  # first merged into since the base was loaded: keep it
                base = self.saved[name] = target.detach().to("cpu", copy=True)
            # In place, no full-size temporaries: a swap costs one pass over the
            # adapted weights (most of a model), not a second copy of them.
            target.copy_(base)
            target.addmm_(b.to(target.device, target.dtype), a.to(target.device, target.dtype),
                          alpha=scale)

    def forget(self) -> None:
        """A full version was loaded: nothing of ours is merged any more."""
        self.base, self.saved = None, {}
