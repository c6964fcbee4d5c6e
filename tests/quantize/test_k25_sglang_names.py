"""Every tensor name of both kimi_k25 builds through SGLang 0.5.23's own wrapper loader (`KimiK25ForConditionalGeneration
.load_weights`, cut from its installed source: tests/sglang_ref/sglang_source.py), with none dropped: text tensors
reach the DeepSeek loader under the text model's own names, vision/projector tensors reach the vision parameters.

The stand-ins below replace SGLang's GPU-built modules only (its MoonViT and DeepseekV3ForCausalLM do not construct on
CPU): the vision parameter table accepts the vision prefixes, the language model records what it is given."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.quantize.test_k25_build import RECIPES
from tests.sglang_ref.sglang_source import kimi_k25_load_weights, kv_scale_remap


class _VisionParams(dict):
    """SGLang's vision parameter table, as far as the wrapper's routing goes: any vision_tower./mm_projector. name."""

    def __contains__(self, name):
        return name.startswith(("vision_tower.", "mm_projector."))

    def __getitem__(self, name):
        self.setdefault("seen", []).append(name)
        return SimpleNamespace(weight_loader=lambda p, w: None)


def _sglang_sees(build_dir) -> tuple[list[str], list[str]]:
    from qverify.quantize.shards import weight_map

    load_weights, mapper = kimi_k25_load_weights()
    vision, language = _VisionParams(), []
    # load_weights builds its table as dict(self.named_parameters(...)): keep the stand-in table instead.
    load_weights.__globals__["dict"] = lambda *_a, **_k: vision
    load_weights.__globals__["default_weight_loader"] = lambda p, w: None
    this = SimpleNamespace(hf_to_sglang_mapper=mapper, config=SimpleNamespace(language_only=False),
                           named_parameters=lambda remove_duplicate=False: vision,
                           language_model=SimpleNamespace(load_weights=lambda ws: language.extend(n for n, _ in ws)))
    load_weights(this, ((n, None) for n in weight_map(build_dir)))
    return language, dict.get(vision, "seen", [])


@pytest.mark.parametrize("recipe", RECIPES)
def test_sglang_kimi_k25_maps_every_tensor_name(k25_built, recipe):
    from qverify.quantize.shards import weight_map

    names = list(weight_map(k25_built(recipe).build_dir))
    language, vision = _sglang_sees(k25_built(recipe).build_dir)
    assert len(language) + len(vision) == len(names)  # none dropped by the mapper or the vision branch
    assert sorted(language) == sorted(n.removeprefix("language_model.") for n in names if n.startswith("language_model."))
    assert all(n.startswith(("model.layers.", "model.embed_tokens.", "model.norm.", "lm_head.")) for n in language)
    assert len(vision) == 7 and {"vision_tower.encoder.blocks.0.attn.qkv_proj.weight",
                                 "mm_projector.linear_1.weight", "mm_projector.linear_2.weight"} <= set(vision)


def test_sglang_loads_no_kv_scale_from_the_wrapper_build(k25_built):
    """After the wrapper strips `language_model.`, the DeepSeek loader's own renaming finds no scale to put on the MLA
    attention (`attn_mqa.k_scale`): SGLang's MLA cache is a plain FP8 cast with scale 1, and trtllm_mla would multiply
    decode logits by any loaded scale (issue 28, docs/serve.md 'FP8 KV on SGLang'). A stray `k_proj.k_scale` under the
    prefix would be renamed onto the attention, which is why the integrity check refuses one."""
    language, _ = _sglang_sees(k25_built("fp8kv_nvfp4shared").build_dir)
    remap = kv_scale_remap()
    params = {f"model.layers.{i}.self_attn.attn_mqa.k_scale": None for i in range(3)}
    assert {remap(n, params) for n in language if n.endswith("k_proj.k_scale")} == set()
    assert remap("model.layers.2.self_attn.k_proj.k_scale", params) == "model.layers.2.self_attn.attn_mqa.k_scale"
