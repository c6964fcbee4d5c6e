"""Recipes: one YAML file each = qverify metadata + the llm-compressor stage(s) to run.

A recipe only chooses and parameterizes; it holds no logic. The llm-compressor part is
passed to `oneshot` verbatim (validated against llm-compressor's own modifier models at
build time, since importing llm-compressor takes seconds). The qverify part is validated
here with `extra="forbid"`, so a typo fails loudly with file:line:col.

Built-ins live in qverify/quantize/recipes/<name>.yaml; a new recipe is a new file. A
path to any YAML file works wherever a recipe name does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from qverify.errors import BadInput, read_input_text
from qverify.models import content_hash, safe_name
from qverify.registry import Registry
from qverify.strict import Strict

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"


MAX_NUM_BITS = 16  # a 16-bit (bf16) model quantized to more bits is not quantized; huge values overflowed
KV_NUM_BITS = (8,)  # llm-compressor 0.14's kv_cache_scheme supports FP8 only ("Only num_bits in (8)")


def _check_num_bits(args: Any, where: str, kv: bool = False) -> None:
    """Every `num_bits` in a modifier's arguments: a whole number of bits that llm-compressor can apply, found
    here (exit 4) rather than as an overflow deep in the build."""
    if isinstance(args, list):
        for i, x in enumerate(args):
            _check_num_bits(x, f"{where}.{i}", kv)
        return
    if not isinstance(args, dict):
        return
    for key, value in args.items():
        if key == "num_bits":
            ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_NUM_BITS
            if not ok or (kv and value not in KV_NUM_BITS):
                allowed = "8" if kv else f"a whole number from 1 to {MAX_NUM_BITS}"
                raise ValueError(f"{where}.num_bits: must be {allowed} (got {value!r})")
        else:
            _check_num_bits(value, f"{where}.{key}", kv or key == "kv_cache_scheme")


class ServingImplications(Strict):
    """Serving settings a build of this recipe needs; the serve layer reads these."""

    kv_cache_dtype: Literal["auto", "fp8_e4m3"] = Field("auto", description="SGLang --kv-cache-dtype")
    weight_quantization: str | None = Field(None, description="checkpoint weight format, e.g. compressed-tensors")
    draft_model_quantization: str | None = Field(None, description="SGLang --speculative-draft-model-quantization")
    requires_drafter: bool = Field(False, description="the build is meaningless without a drafter")


class CalibrationDefaults(Strict):
    samples: int = Field(128, ge=1, description="calibration samples (CLI --calib-samples overrides)")
    seq_len: int = Field(512, ge=8, description="tokens per sample (CLI --calib-seq-len overrides)")
    # `basic` runs the whole model per batch: on CPU it is ~7x faster than `sequential`
    # (measured 2 s vs 14 s on the tiny model); `sequential` saves GPU memory on big models.
    pipeline: Literal["basic", "sequential", "independent"] = "basic"


class Corruption(Strict):
    """Deliberate damage, for lossy controls only: proves the gate detects it, and (the damage dial)
    makes diffuse regressions of a chosen size to calibrate the gate's tolerances against."""

    sglang_k_scale: float | None = Field(
        None, gt=0, description="write this k_scale under the name SGLang loads onto every MLA attention (the "
                                "fp8kv_badscale control; kv_scales.py): SGLang's trtllm_mla multiplies decode logits by it")
    shared_expert_noise: float | None = Field(
        None, ge=0, le=10, description="the damage dial: add Gaussian noise of this scale, relative to each weight "
                                       "matrix's RMS, to every shared-expert weight (docs/gate.md, 'Damage dial'); "
                                       "0: the same weights under another build id (an A/A control)")
    seed: int = Field(0, ge=0, description="seed of the shared-expert noise (a different seed: another build of the same size)")

    @model_validator(mode="after")
    def _some(self) -> Corruption:
        if self.sglang_k_scale is None and self.shared_expert_noise is None:
            raise ValueError("corrupt needs sglang_k_scale or shared_expert_noise")
        if self.sglang_k_scale == 1.0:
            raise ValueError("corrupt.sglang_k_scale 1.0 changes nothing (SGLang's default)")
        return self


class Recipe(Strict):
    name: str
    version: int = 1
    description: str
    changes: list[str] = Field(default_factory=list, description="what the recipe changes, one line each")
    control: bool = Field(False, description="a lossy control, expected to FAIL the gate")
    serving: ServingImplications = Field(default_factory=ServingImplications)
    calibration: CalibrationDefaults = Field(default_factory=CalibrationDefaults)
    target: dict[str, Any] | None = Field(None, description="llm-compressor recipe for the target model")
    drafter: dict[str, Any] | None = Field(None, description="llm-compressor recipe for the drafter")
    corrupt: Corruption | None = None

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        return safe_name(v, "recipe name")  # it names the build's folder

    @field_validator("target", "drafter")
    @classmethod
    def _stages(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        # llm-compressor silently skips keys not ending in _stage/_modifiers; qverify refuses them.
        if v is None:
            return v
        for stage, body in v.items():
            if not stage.endswith("_stage") or not isinstance(body, dict):
                raise ValueError(f"{stage!r}: expected '<name>_stage: {{<name>_modifiers: ...}}'")
            for group, mods in body.items():
                if not group.endswith("_modifiers") or not isinstance(mods, dict) or not mods:
                    raise ValueError(f"{stage}.{group}: expected '<name>_modifiers: {{ModifierName: {{args}}}}'")
                for mod, args in mods.items():
                    if not isinstance(args, dict):  # ValueError: pydantic reports only ValueErrors as invalid input
                        raise ValueError(f"{stage}.{group}.{mod}: modifier arguments must be a mapping")  # noqa: TRY004
                    _check_num_bits(args, f"{stage}.{group}.{mod}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Recipe:
        if self.corrupt is not None and not self.control:
            raise ValueError("'corrupt' is only allowed in a control recipe (control: true)")
        has_kv = any("kv_cache_scheme" in args for args in self.modifiers("target"))
        if self.corrupt is not None and self.corrupt.sglang_k_scale is not None and not has_kv:
            raise ValueError("'corrupt.sglang_k_scale' needs a target stage with kv_cache_scheme")
        if has_kv != (self.serving.kv_cache_dtype == "fp8_e4m3"):
            raise ValueError("serving.kv_cache_dtype must be fp8_e4m3 exactly when the target has kv_cache_scheme")
        if self.drafter is not None and not self.serving.requires_drafter:
            raise ValueError("a recipe with a drafter stage must set serving.requires_drafter: true")
        for which in ("target", "drafter"):
            for args in self.modifiers(which):
                if args.get("targets") and "scheme" in args and not args["scheme"] and not args.get("config_groups"):
                    # llm-compressor then applies only the KV scheme: the build claimed weights it never quantized
                    raise ValueError(f"{which}: a modifier targets {args['targets']} with scheme null, which "
                                     "quantizes none of them; give a scheme (e.g. NVFP4), or drop targets")
        return self

    def modifiers(self, which: Literal["target", "drafter"]) -> list[dict[str, Any]]:
        """Every modifier's arguments in the given stage set."""
        stages = getattr(self, which) or {}
        return [args for body in stages.values() for mods in body.values() for args in mods.values()]

    @property
    def digest(self) -> str:
        """Hash of the validated content: comments and formatting do not change a build id."""
        return content_hash(self.model_dump(mode="json"))

    def resolved_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


class LoadedRecipe(BaseModel):
    recipe: Recipe
    path: Path
    text: str
    builtin: bool


# --------------------------------------------------------------------------- YAML with marks


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _mark_of(text: str, loc: tuple) -> yaml.Mark | None:
    """Line/column of the node at a pydantic error location, for file:line:col messages."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            hit = [(k, v) for k, v in node.value if k.value == part]
            if not hit:
                return node.start_mark
            key, node = hit[0]
            if isinstance(part, str) and not isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
                return key.start_mark
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            break
    return node.start_mark if node is not None else None


def parse_recipe(text: str, path: Path, builtin: bool = False) -> LoadedRecipe:
    """Validate recipe text; errors are BadInput with file:line:col."""
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise BadInput(f"{where}: malformed YAML: {problem}", fix="fix the YAML syntax at that position") from None
    if not isinstance(raw, dict):
        raise BadInput(f"{path}:1:1: a recipe must be a YAML mapping", fix="see docs/build.md, 'Recipe format'")
    raw.setdefault("name", path.stem)
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        mark = _mark_of(text, err["loc"])
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        loc = ".".join(str(x) for x in err["loc"]) or "recipe"
        what = f"unknown key {loc!r}" if err["type"] == "extra_forbidden" else f"{loc}: {err['msg'].removeprefix('Value error, ')}"
        raise BadInput(f"{where}: {what}", fix="see docs/build.md, 'Recipe format'") from None
    return LoadedRecipe(recipe=recipe, path=path, text=text, builtin=builtin)


# --------------------------------------------------------------------------- registry


def _registry() -> Registry[Path]:
    reg: Registry[Path] = Registry("recipe")
    for p in sorted(RECIPES_DIR.glob("*.yaml")):
        reg.add(p.stem, p)
    return reg


def list_recipes() -> list[LoadedRecipe]:
    """Every built-in recipe, validated, sorted by name."""
    return [parse_recipe(p.read_text(), p, builtin=True) for _, p in _registry().items()]


def load_recipe(name_or_path: str | Path) -> LoadedRecipe:
    """A built-in name (did-you-mean on a typo) or a path to a recipe YAML file."""
    s = str(name_or_path)
    p = Path(s).expanduser()
    if p.suffix in (".yaml", ".yml") or "/" in s:  # a bare word is always a name, never a file in cwd
        if not p.is_file():
            raise BadInput(f"recipe file {s} not found", fix="pass an existing YAML path or a name from 'qverify recipes'")
        return parse_recipe(read_input_text(p, "recipe", "pass a recipe YAML file or a name from 'qverify recipes'"), p)
    path = _registry().get(s)
    return parse_recipe(path.read_text(), path, builtin=True)
