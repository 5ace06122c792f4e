"""Shared fixtures: temp stores and a tiny published policy, nothing downloaded."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# moto_server / s3_env: a real S3-protocol server on 127.0.0.1 (tests/s3server.py);
# bpe_model_dir / smollm2_dir: real HF model folders, nothing from the hub (tests/hf_fixtures.py).
pytest_plugins = ["tests.s3server", "tests.hf_fixtures"]


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)
    yield


@pytest.fixture
def tiny_policy_dir(tmp_path):
    """A random tiny model saved in HF format (hidden 64, 2 layers)."""
    from astraflow.models.factory import save_policy, tiny_llama
    from astraflow.models.tokenizer import build_char_tokenizer

    d = tmp_path / "policy"
    d.mkdir()
    save_policy(tiny_llama(hidden_size=64, layers=2, heads=2, intermediate_size=128), build_char_tokenizer(), d)
    return d


#: Test files that take several minutes on one worker: collected first, so that
#: `--dist loadfile` starts them at once instead of leaving them for the end of the run,
#: where they would run alone while the other worker sits idle.
LONGEST_FIRST = ("test_learning_holds.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in LONGEST_FIRST)  # stable: the rest keep order
