"""Session fixtures shared across test packages: tiny real models (random and memorised)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    import torch

    torch.set_num_threads(1)  # 2-core box: one thread per worker


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from tests.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def parrot_dir(tiny_model_dir, tmp_path_factory) -> Path:
    from tests.parrot import make_parrot

    return make_parrot(tiny_model_dir, tmp_path_factory.mktemp("parrot") / "model")


# The Kimi-shaped checkpoint (INT4 pack-quantized routed experts, remote-code tokenizer), for every test package.
from tests.fixtures.kimi_shaped import kimi_shaped  # noqa: E402,F401
from tests.fixtures.kimi_k25 import kimi_k25  # noqa: E402,F401


# The fast tier (`pytest -m "not slow"`, README "Development") leaves out every test that uses one of these:
# each builds with llm-compressor, trains a model, serves a build or starts MLflow, and the tests on them run the
# real pipeline (10 s to minutes each on a 2-core box). Other slow tests carry @pytest.mark.slow themselves.
SLOW_FIXTURES = {"built", "k25_built", "kimi_built", "kimi_shaped", "kimi_k25", "parrot_dir", "bf16_build",
                 "source_model", "probe_ids", "uploaded"}


def pytest_collection_modifyitems(items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
