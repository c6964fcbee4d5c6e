"""Serving builds: recipes → llm-compressor → integrity-checked checkpoints (docs/build.md).

Light to import: torch, transformers and llm-compressor load only when a build or a load
runs. `build` is imported eagerly on purpose: importing the submodule
`qverify.quantize.build` would otherwise replace the function on this package.
"""

from __future__ import annotations

from qverify.quantize.build import BuildResult, build
from qverify.quantize.loader import LoadedBuild, VerifyReport, load_build, set_quantization_enabled, verify_build
from qverify.quantize.recipe import LoadedRecipe, Recipe, list_recipes, load_recipe

__all__ = ["BuildResult", "LoadedBuild", "LoadedRecipe", "Recipe", "VerifyReport", "build", "list_recipes", "load_build",
           "load_recipe", "set_quantization_enabled", "verify_build"]
