"""`qverify recipes`: the built-in quantization recipes and the serving settings they imply."""

from __future__ import annotations

import typer

from qverify.commands._common import state


def recipes_cmd(ctx: typer.Context) -> None:
    """List the built-in quantization recipes (a recipe is one YAML file; see docs/build.md)."""
    from qverify.quantize.recipe import RECIPES_DIR, list_recipes

    s = state(ctx)
    rows, data = [], []
    for loaded in list_recipes():
        r = loaded.recipe
        sv = r.serving
        implies = [f"kv={sv.kv_cache_dtype}"] + ([f"weights={sv.weight_quantization}"] if sv.weight_quantization else []) \
            + ([f"drafter={sv.draft_model_quantization}"] if sv.draft_model_quantization else []) \
            + (["needs drafter"] if sv.requires_drafter else [])
        rows.append([r.name, "control" if r.control else "", r.description, ", ".join(implies)])
        data.append({"name": r.name, "control": r.control, "description": r.description, "changes": r.changes,
                     "serving": sv.model_dump(), "stages": [w for w in ("target", "drafter") if getattr(r, w)],
                     "path": str(loaded.path), "hash": r.digest})
    s.out.table(f"recipes ({RECIPES_DIR})", ["name", "control", "description", "serving"], rows)
    s.out.data(data)


def register(app: typer.Typer) -> None:
    app.command("recipes", help="List the built-in quantization recipes.")(recipes_cmd)
