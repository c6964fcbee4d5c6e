"""Recipes: built-ins validate, typos fail loudly with file:line:col, unknown names get did-you-mean."""

from __future__ import annotations

import pytest

from qverify.errors import BadInput
from qverify.quantize.recipe import list_recipes, load_recipe

BUILTINS = {"bf16", "fp8kv", "nvfp4shared", "fp8kv_nvfp4shared", "fp8drafter", "fp8kv_nvfp4shared_fp8drafter",
            "nvfp4_all", "fp8kv_badscale", "noise_shared"}


def test_builtins_validate_and_declare_serving():
    recipes = {r.recipe.name: r.recipe for r in list_recipes()}
    assert BUILTINS <= set(recipes)
    assert recipes["fp8kv"].serving.kv_cache_dtype == "fp8_e4m3"
    assert recipes["nvfp4shared"].serving.kv_cache_dtype == "auto"
    assert recipes["fp8kv_nvfp4shared_fp8drafter"].serving.requires_drafter
    assert recipes["fp8drafter"].target is None and recipes["fp8drafter"].drafter is not None
    assert recipes["bf16"].target is None and recipes["bf16"].drafter is None
    assert {n for n, r in recipes.items() if r.control} >= {"nvfp4_all", "fp8kv_badscale"}
    assert recipes["fp8kv_badscale"].corrupt.sglang_k_scale not in (None, 1.0)
    kv = recipes["fp8kv"].modifiers("target")[0]["kv_cache_scheme"]
    assert kv["observer"] == "static_minmax" and kv["type"] == "float" and kv["num_bits"] == 8
    assert recipes["nvfp4shared"].modifiers("target")[0]["targets"] == ["re:.*shared_experts.*"]


def test_unknown_name_suggests_and_lists():
    with pytest.raises(BadInput) as e:
        load_recipe("fp8kv_nvfp4")
    msg = e.value.one_line()
    assert "did you mean 'fp8kv_nvfp4shared'" in msg and "bf16" in msg and "nvfp4_all" in msg


def test_malformed_yaml_names_file_line_col(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("description: x\nserving:\n  kv_cache_dtype: [fp8\n")
    with pytest.raises(BadInput) as e:
        load_recipe(p)
    assert f"{p}:4:1" in str(e.value) or f"{p}:3:" in str(e.value)
    assert "malformed YAML" in str(e.value)


def test_unknown_key_is_refused_with_position(tmp_path):
    p = tmp_path / "typo.yaml"
    p.write_text("description: x\nserving:\n  kv_cache_dtpye: fp8_e4m3\n")
    with pytest.raises(BadInput) as e:
        load_recipe(p)
    assert f"{p}:3:3" in str(e.value) and "kv_cache_dtpye" in str(e.value)


def test_duplicate_keys_are_refused(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text("description: a\ndescription: b\n")
    with pytest.raises(BadInput, match="duplicate key 'description'"):
        load_recipe(p)


def test_stage_keys_must_follow_llmcompressor_shape(tmp_path):
    p = tmp_path / "stage.yaml"
    p.write_text("description: x\ntarget:\n  quant:\n    quant_modifiers: {QuantizationModifier: {}}\n")
    with pytest.raises(BadInput, match="_stage"):
        load_recipe(p)


def test_kv_dtype_must_match_kv_scheme(tmp_path):
    p = tmp_path / "kv.yaml"
    p.write_text("description: x\nserving: {kv_cache_dtype: fp8_e4m3}\n")
    with pytest.raises(BadInput, match="kv_cache_dtype"):
        load_recipe(p)


def test_corruption_only_in_controls(tmp_path):
    text = (load_recipe("fp8kv_badscale").text).replace("control: true", "control: false")
    p = tmp_path / "sneaky.yaml"
    p.write_text(text)
    with pytest.raises(BadInput, match="control"):
        load_recipe(p)


def test_user_file_named_by_stem_and_hash_ignores_comments(tmp_path):
    base = load_recipe("fp8kv")
    p = tmp_path / "mine.yaml"
    p.write_text("# my comment\n" + base.text)
    mine = load_recipe(str(p))
    assert mine.recipe.name == "mine" and not mine.builtin
    assert mine.recipe.model_dump(exclude={"name"}) == base.recipe.model_dump(exclude={"name"})


def test_missing_recipe_file(tmp_path):
    with pytest.raises(BadInput, match="not found"):
        load_recipe(tmp_path / "nope.yaml")


def test_damage_dial_is_a_validated_control_field(tmp_path):
    dial = load_recipe("noise_shared").recipe
    assert dial.control and dial.corrupt.shared_expert_noise == 0.5 and dial.corrupt.sglang_k_scale is None
    text = load_recipe("noise_shared").text
    for bad, match in ((text.replace("seed: 0", "sead: 0"), "unknown key 'corrupt.sead'"),
                       (text.replace("shared_expert_noise: 0.5", "shared_expert_noise: -1"), "shared_expert_noise"),
                       (text.replace("  shared_expert_noise: 0.5\n", ""), "sglang_k_scale or shared_expert_noise")):
        p = tmp_path / "dial.yaml"
        p.write_text(bad)
        with pytest.raises(BadInput, match=match):
            load_recipe(p)


def test_damage_dial_noise_has_the_stated_relative_scale(tiny_model):
    """sigma is relative to each shared-expert matrix's RMS; nothing else moves; the same seed, the same weights."""
    import torch

    from qverify.quantize.compress import load_source, noise_shared_experts

    a, b, c = load_source(tiny_model), load_source(tiny_model), load_source(tiny_model)
    before = {n: p.detach().clone() for n, p in a.named_parameters()}
    assert noise_shared_experts(a, 0.5, seed=0) > 0 and noise_shared_experts(b, 0.5, seed=0) > 0
    noise_shared_experts(c, 0.5, seed=1)
    for n, p in a.named_parameters():
        if "shared_experts" in n and n.endswith("weight") and p.dim() == 2:
            w = before[n].float()
            ratio = ((p.float() - w).pow(2).mean().sqrt() / w.pow(2).mean().sqrt()).item()
            assert 0.4 < ratio < 0.6, (n, ratio)
            assert torch.equal(p, dict(b.named_parameters())[n]) and not torch.equal(p, dict(c.named_parameters())[n])
        else:
            assert torch.equal(p, before[n]), n
