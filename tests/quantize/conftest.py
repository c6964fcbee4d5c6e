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


@pytest.fixture(scope="session")
def built(tiny_model, workdir):
    """built(recipe) -> BuildResult, each recipe built once per session."""
    from qverify.quantize import build

    cache: dict = {}

    def get(recipe: str):
        if recipe not in cache:
            cache[recipe] = build(recipe, model=tiny_model, workdir=workdir, **CALIB)
        return cache[recipe]

    return get


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
