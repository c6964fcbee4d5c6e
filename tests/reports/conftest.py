"""Shared, session-scoped state: one synthetic workdir with two gates, uploaded once to a real sqlite store.

Creating an MLflow sqlite store runs its migrations (about 10 s here), so the upload
tests share one store; tests that need their own store (replay, server) make it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from .fixtures import ENV_SECRET_NAME, SECRETS, make_gate

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session", autouse=True)
def secret_env():
    """A secret in the environment that also shows up, unnamed, in the server logs."""
    old = os.environ.get(ENV_SECRET_NAME)
    os.environ[ENV_SECRET_NAME] = SECRETS["env"]
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # the default (sqlite in the workdir) is what is under test
    yield
    if old is None:
        os.environ.pop(ENV_SECRET_NAME, None)
    else:
        os.environ[ENV_SECRET_NAME] = old


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    wd = tmp_path_factory.mktemp("qv") / ".qverify"
    make_gate(wd, "g-main", ["fp8kv_nvfp4shared", "nvfp4_all"])
    make_gate(wd, "g-second", ["fp8kv"])  # INCONCLUSIVE with these seeds: coding's CI reaches the fail line
    make_gate(wd, "g-third", ["fp8kv_nvfp4shared"])  # the same PASS build gated again: the alias moves
    return wd


@pytest.fixture(scope="session")
def uploaded(workdir):
    from qverify.reports.upload import upload_gate

    return upload_gate(workdir, "g-main")


@pytest.fixture(scope="session")
def client(workdir, uploaded):
    from mlflow import MlflowClient

    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: scripts/setup.sh installs the Debian package 'chromium'")
        pytest.skip("chromium not installed (Debian package 'chromium')")
    return exe


def chromium_args(exe: str, profile: Path) -> list[str]:
    return [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--hide-scrollbars", f"--user-data-dir={profile}"]
