"""Recipe -> QuantPlan: derivation from llm-compressor recipe YAML, read through qverify.quantize.recipe."""

from __future__ import annotations

import pytest
import yaml

from qverify.capacity.quantplan import PLANNER_ONLY, from_tree, quant_plan
from qverify.errors import BadInput
from qverify.quantize.recipe import RECIPES_DIR


def from_recipe_yaml(text: str, name: str, source: str):
    return from_tree(yaml.safe_load(text), name, source)

# qverify's recipe format (qverify/quantize/recipe.py): metadata + llm-compressor stages
FP8KV_NVFP4SHARED = """
description: FP8 KV cache and NVFP4 shared experts
serving:
  kv_cache_dtype: fp8_e4m3
target:
  quant_stage:
    quant_modifiers:
      QuantizationModifier:
        ignore: [lm_head]
        config_groups:
          group_0:
            targets: ["re:.*shared_experts.*"]
            weights: {num_bits: 4, type: float, strategy: tensor_group, group_size: 16, symmetric: true}
            input_activations: {num_bits: 4, type: float, strategy: tensor_group, group_size: 16, dynamic: local}
        kv_cache_scheme: {num_bits: 8, type: float, strategy: tensor, dynamic: false, symmetric: true}
"""

NVFP4_ALL_WITH_DRAFTER = """
description: everything NVFP4, drafter FP8
serving:
  requires_drafter: true
target:
  quant_stage:
    quant_modifiers:
      QuantizationModifier: {ignore: [lm_head], scheme: {NVFP4: [Linear], NVFP4A16: ["re:.*kv_b_proj$"]}}
drafter:
  quant_stage:
    quant_modifiers:
      QuantizationModifier: {targets: [Linear], scheme: FP8_DYNAMIC, ignore: [lm_head]}
"""


def test_yaml_with_config_groups_and_kv_scheme():
    qp = from_recipe_yaml(FP8KV_NVFP4SHARED, "x", "test")
    assert qp.kv_dtype == "fp8" and qp.schemes == {"shared_experts": "nvfp4"} and qp.drafter_scheme == "bf16"
    assert qp.description.startswith("FP8 KV")


def test_yaml_preset_scheme_hits_every_linear_class_but_the_ignored_head():
    qp = from_recipe_yaml(NVFP4_ALL_WITH_DRAFTER, "x", "test")
    assert qp.schemes == {c: "nvfp4" for c in ("attention", "dense_mlp", "routed_experts", "shared_experts")}
    assert qp.drafter_scheme == "fp8" and qp.kv_dtype == "bf16"


def test_yaml_errors_are_bad_input(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,")
    with pytest.raises(BadInput, match="malformed YAML"):
        quant_plan(str(bad))
    with pytest.raises(BadInput, match="cannot price"):
        from_recipe_yaml("s:\n  QuantizationModifier: {targets: [Linear], scheme: W2A2_MADEUP}", "x", "odd.yaml")


def test_recipe_yaml_path_goes_through_the_validated_recipe_model(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text(NVFP4_ALL_WITH_DRAFTER)
    qp = quant_plan(str(f))
    assert qp.name == "mine" and qp.source == str(f) and qp.drafter_scheme == "fp8"
    f.write_text(NVFP4_ALL_WITH_DRAFTER.replace("requires_drafter", "requires_drafer"))
    with pytest.raises(BadInput, match="requires_drafer"):  # qverify.quantize's extra="forbid"
        quant_plan(str(f))
    with pytest.raises(BadInput, match="does not exist"):
        quant_plan(str(tmp_path / "nope.yaml"))


def test_unknown_recipe_suggests_a_name():
    with pytest.raises(BadInput, match="did you mean 'fp8kv_nvfp4shared'"):
        quant_plan("fp8kv_nvfp4shard")


SHIPPED = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
_NV_ALL = {c: "nvfp4" for c in ("attention", "dense_mlp", "routed_experts", "shared_experts")}
# what each shipped recipe does to memory: (KV dtype, weight scheme per module class, drafter scheme)
EXPECTED = {
    "bf16": ("bf16", {}, "bf16"),
    "as_shipped": ("bf16", {}, "bf16"),  # the source's own quantization comes from its config (with_source)
    "fp8kv": ("fp8", {}, "bf16"),
    "fp8kv_badscale": ("fp8", {}, "bf16"),
    "nvfp4shared": ("bf16", {"shared_experts": "nvfp4"}, "bf16"),
    "fp8kv_nvfp4shared": ("fp8", {"shared_experts": "nvfp4"}, "bf16"),
    "fp8drafter": ("bf16", {}, "fp8"),
    "fp8kv_nvfp4shared_fp8drafter": ("fp8", {"shared_experts": "nvfp4"}, "fp8"),
    "nvfp4_all": ("bf16", _NV_ALL, "bf16"),
    "noise_shared": ("bf16", {}, "bf16"),  # the damage dial perturbs bf16 weights in place: no bytes change
}


@pytest.mark.skipif(not SHIPPED, reason="no recipes in qverify/quantize/recipes yet")
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_recipes_price_as_expected(name):
    # The planner reads the shipped YAML through qverify.quantize's recipe model (no table of its own).
    qp = quant_plan(name)
    assert qp.source.endswith(f"{name}.yaml")
    assert name in EXPECTED, f"add {name} to EXPECTED in this test"
    assert (qp.kv_dtype, qp.schemes, qp.drafter_scheme) == EXPECTED[name]


def test_planner_only_layouts_are_not_shipped_recipes():
    assert PLANNER_ONLY and not set(PLANNER_ONLY) & set(SHIPPED)
    assert quant_plan("int4_experts").schemes == {"routed_experts": "int4_g32"}
