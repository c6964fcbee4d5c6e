"""Serving builds: recipes → llm-compressor → integrity-checked checkpoints (README, 'qverify build').

Light to import: torch, transformers and llm-compressor load only when a build or a load runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from qverify.quantize.recipe import LoadedRecipe, Recipe, list_recipes, load_recipe

if TYPE_CHECKING:
    from qverify.quantize.build import BuildResult
    from qverify.quantize.loader import LoadedBuild, VerifyReport

__all__ = ["build", "load_build", "verify_build", "list_recipes", "load_recipe", "Recipe", "LoadedRecipe",
           "set_quantization_enabled"]


def build(recipe: str | Path, **kwargs) -> "BuildResult":
    """See qverify.quantize.build.build."""
    from qverify.quantize.build import build as _build

    return _build(recipe, **kwargs)


def load_build(build_dir: str | Path, device: str = "cpu", check_hashes_first: bool = True) -> "LoadedBuild":
    """See qverify.quantize.loader.load_build."""
    from qverify.quantize.loader import load_build as _load

    return _load(build_dir, device=device, check_hashes_first=check_hashes_first)


def verify_build(build_dir: str | Path) -> "VerifyReport":
    """See qverify.quantize.loader.verify_build."""
    from qverify.quantize.loader import verify_build as _verify

    return _verify(build_dir)


def set_quantization_enabled(model, on: bool) -> None:
    from qverify.quantize.loader import set_quantization_enabled as _set

    _set(model, on)
