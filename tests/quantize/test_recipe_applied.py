"""What a build claims is what was applied (#37): a weight group that applies nothing is bad input (exit 4), and
build.json's serving metadata comes from the quantized model, not the recipe's words. Real llm-compressor on the
tiny model."""

from __future__ import annotations

import pytest

from qverify.errors import BadInput
from qverify.models import SchemeSummary
from qverify.quantize import manifest as mf
from qverify.quantize.recipe import load_recipe


def _variant(tmp_path, name: str, old: str, new: str):
    text = load_recipe("fp8kv_nvfp4shared").text
    assert old in text
    p = tmp_path / f"{name}.yaml"
    p.write_text(text.replace(old, new))
    return p


def test_a_null_scheme_with_targets_is_refused(tmp_path):
    """It built FP8 KV only, exit 0, while its changes and serving metadata claimed NVFP4 shared experts."""
    p = _variant(tmp_path, "nullscheme", "scheme: NVFP4", "scheme: null")
    with pytest.raises(BadInput, match="scheme null, which quantizes none of them"):
        load_recipe(p)


def test_serving_metadata_comes_from_what_was_applied():
    kv_only = [SchemeSummary(scheme="kv_cache:fp8_e4m3", targets=["attention"], modules=4)]
    claimed = {"kv_cache_dtype": "fp8_e4m3", "weight_quantization": "compressed-tensors",
               "draft_model_quantization": "compressed-tensors"}
    assert mf.applied_serving(claimed, kv_only, shipped=False) == {
        "kv_cache_dtype": "fp8_e4m3", "weight_quantization": None, "draft_model_quantization": None}
    nvfp4 = [*kv_only, SchemeSummary(scheme="NVFP4", targets=["re:.*shared_experts.*"], modules=9, params=10)]
    assert mf.applied_serving(claimed, nvfp4, shipped=False)["weight_quantization"] == "compressed-tensors"
    assert mf.applied_serving(claimed, kv_only, shipped=True)["weight_quantization"] == "compressed-tensors"


def test_the_built_recipe_still_claims_what_it_applied(built):
    m = built("fp8kv_nvfp4shared").manifest
    assert m.serving["weight_quantization"] == "compressed-tensors"
    assert any(s.scheme == "NVFP4" and s.modules == 6 for s in m.quantization)
    assert built("fp8kv").manifest.serving.get("weight_quantization") is None
