"""Bundled assets: the embedded reference model qverify-tiny (target + drafter/) and its tokenizer."""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parent
EMBEDDED_MODEL = ASSETS / "qverify-tiny"


def default_model_dir() -> Path:
    return EMBEDDED_MODEL
