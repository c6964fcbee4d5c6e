"""Fixtures: a tiny random-weight DeepSeek-V3 (+ drafter) and its builds, shared by the session.

Real llm-compressor, real safetensors, real loads: nothing here is mocked. Builds use a
small calibration set (16 samples x 128 tokens) so the whole recipe matrix stays fast
on CPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
CALIB = {"calib_samples": 16, "calib_seq_len": 128}


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from tests.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("workdir")


KIMI_CALIB = {"calib_samples": 8, "calib_seq_len": 64}  # the Kimi-shaped sources: only the build path is under test


def builds_of(model: Path, workdir: Path, **kw):
    """get(recipe) -> BuildResult of `model`, each recipe built once (held by a session fixture)."""
    from qverify.quantize import build

    cache: dict = {}

    def get(recipe: str):
        if recipe not in cache:
            cache[recipe] = build(recipe, model=model, workdir=workdir, **kw)
        return cache[recipe]

    return get


@pytest.fixture(scope="session")
def built(tiny_model, workdir):
    """built(recipe) -> BuildResult of the tiny model."""
    return builds_of(tiny_model, workdir, **CALIB)


@pytest.fixture(scope="session")
def k25_built(kimi_k25, tmp_path_factory):
    """Builds of Kimi K2.6 as released (the kimi_k25 wrapper)."""
    return builds_of(kimi_k25, tmp_path_factory.mktemp("k25_wd"), trust_remote_code=True, **KIMI_CALIB)


@pytest.fixture(scope="session")
def kimi_built(kimi_shaped, tmp_path_factory):
    """Builds of the Kimi-shaped source."""
    return builds_of(kimi_shaped, tmp_path_factory.mktemp("kimi_wd"), trust_remote_code=True, **KIMI_CALIB)


@pytest.fixture(scope="session")
def source_model(tiny_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype="auto").eval()


@pytest.fixture(scope="session")
def probe_ids(tiny_model):
    """A fixed batch of chat-formatted token ids to compare logits on."""
    from transformers import AutoTokenizer

    from qverify.quantize.calibration import load_calibration

    tok = AutoTokenizer.from_pretrained(tiny_model)
    texts = load_calibration("coding", 2, 64).texts
    enc = tok(texts, add_special_tokens=False, truncation=True, max_length=48, padding="max_length", return_tensors="pt")
    return enc["input_ids"]
