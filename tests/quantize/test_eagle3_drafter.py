"""An EAGLE3 drafter head (what SGLang's Kimi drafters are) is not a causal LM: a build carries it byte for byte and
checks it for SGLang (config, tensor names its EAGLE3 loaders map) instead of reloading it."""

from __future__ import annotations

import json

import pytest

from qverify.errors import BadInput
from tests.quantize.test_kimi_build import KIMI_CALIB

HIDDEN = 64  # the Kimi-shaped fixture's hidden size
LAYER = ["input_layernorm", "hidden_norm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
         "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


HEADS, KV_HEADS, HEAD_DIM, INTER = 4, 2, 16, 128


def make_eagle3_head(out, rename: dict[str, str] | None = None, hidden: int = HIDDEN):
    """A tiny head in SGLang/SpecForge's LlamaForCausalLMEagle3 layout (random weights, the shapes SGLang builds:
    q/k/v read 2 x hidden; the embedded engine runs it: tests/serve/test_eagle3_engine.py)."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True)
    t = {"fc.weight": torch.randn(hidden, 3 * hidden) / (3 * hidden) ** 0.5, "norm.weight": torch.ones(hidden),
         "lm_head.weight": torch.randn(256, hidden), "d2t": torch.zeros(256, dtype=torch.int64),
         "t2d": torch.ones(768, dtype=torch.bool)}
    shapes = {"self_attn.q_proj": (HEADS * HEAD_DIM, 2 * hidden), "self_attn.k_proj": (KV_HEADS * HEAD_DIM, 2 * hidden),
              "self_attn.v_proj": (KV_HEADS * HEAD_DIM, 2 * hidden), "self_attn.o_proj": (hidden, HEADS * HEAD_DIM),
              "mlp.gate_proj": (INTER, hidden), "mlp.up_proj": (INTER, hidden), "mlp.down_proj": (hidden, INTER)}
    t |= {f"midlayer.{n}.weight": torch.randn(shapes[n]) / shapes[n][1] ** 0.5 if n in shapes else torch.ones(hidden)
          for n in LAYER}
    rename = rename or {}
    t = {rename.get(k, k): v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in t.items()
         if rename.get(k, k) is not None}  # renamed to None: left out
    save_file(t, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "intermediate_size": INTER,
        "num_hidden_layers": 1, "draft_vocab_size": 256, "vocab_size": 768, "tie_word_embeddings": False}))
    return out


def test_eagle3_head_carried_and_checked(kimi_shaped, tmp_path):
    from qverify.quantize import build
    from qverify.quantize.loader import verify_build

    head = make_eagle3_head(tmp_path / "eagle3")
    res = build("fp8kv_nvfp4shared", model=kimi_shaped, drafter=head, workdir=tmp_path / "wd", trust_remote_code=True,
                **KIMI_CALIB)
    assert res.manifest.drafter_kind == "eagle3"
    for name in ("model.safetensors", "config.json"):
        assert (res.build_dir / "drafter" / name).read_bytes() == (head / name).read_bytes()
    assert any(k.startswith("drafter/model.safetensors::fc.weight") for k in res.manifest.tensor_hashes)
    assert verify_build(res.build_dir, trust_remote_code=True).drafter_load.startswith("eagle3")


@pytest.mark.parametrize("problem, rename, hidden", [
    ("name SGLang's EAGLE3 loaders skip", {"midlayer.mlp.down_proj.weight": "midlayer.mlp.down.weight"}, HIDDEN),
    ("lacks fc.weight", {"fc.weight": None}, HIDDEN),
    ("hidden size 32", None, 32),
])
def test_bad_eagle3_head_is_refused_before_building(kimi_shaped, tmp_path, problem, rename, hidden):
    from qverify.quantize import build

    head = make_eagle3_head(tmp_path / "eagle3", rename, hidden)
    with pytest.raises(BadInput, match=problem):
        build("fp8kv_nvfp4shared", model=kimi_shaped, drafter=head, workdir=tmp_path / "wd", trust_remote_code=True)


def test_an_eagle3_head_takes_only_the_data_free_fp8_stage(kimi_shaped, tmp_path):
    """FP8_DYNAMIC needs no data and is what SGLang's FP8 head path loads; any other drafter stage is refused
    (tests/quantize/test_eagle3_fp8.py covers the FP8 head itself)."""
    from qverify.quantize import build

    recipe = tmp_path / "nvfp4drafter.yaml"
    recipe.write_text("description: NVFP4 drafter\nserving: {requires_drafter: true, draft_model_quantization: compressed-tensors}\n"
                      "drafter: {quant_stage: {quant_modifiers: {QuantizationModifier: {targets: [Linear], scheme: NVFP4}}}}\n")
    with pytest.raises(BadInput, match="data-free FP8_DYNAMIC"):
        build(recipe, model=kimi_shaped, drafter=make_eagle3_head(tmp_path / "e"), workdir=tmp_path / "wd",
              trust_remote_code=True)
