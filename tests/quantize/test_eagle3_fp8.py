"""The FP8 EAGLE3 drafter: qverify's data-free FP8 stage writes heads that SGLang 0.5.23's own loaders map
(their `load_weights`, cut from its source: tests/sglang_ref/eagle3_source.py), with `fc`, `lm_head`, the
embeddings and the MLA head's `kv_b_proj` left bf16, and builds record what SGLang must be told."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from qverify.errors import BadInput
from qverify.quantize.eagle3_fp8 import KEEP_BF16, quantize_head
from qverify.quantize.eagle3_fp8 import QUANTIZED as QUANTIZED_NAME
from qverify.quantize.manifest import IntegrityError
from tests.quantize.test_eagle3_drafter import HIDDEN, make_eagle3_head
from tests.quantize.test_kimi_build import KIMI_CALIB
from tests.serve.test_sglang_cmd import sglang_parser  # noqa: F401 -- fixture: SGLang's own parser
from tests.sglang_ref import eagle3_source as sg

torch.set_num_threads(1)
Q_RANK, KV_RANK, ROPE, NOPE, V, HEADS, INTER = 32, 32, 16, 16, 16, 4, 128


def make_mla_head(out, hidden: int = HIDDEN):
    """A tiny head in SGLang's Eagle3DeepseekV2ForCausalLM layout (kimi_k25_eagle3.py; random weights)."""
    out.mkdir(parents=True)
    a = "layers.0.self_attn."
    shapes = {f"{a}q_a_proj.weight": (Q_RANK, 2 * hidden), f"{a}q_a_layernorm.weight": (Q_RANK,),
              f"{a}q_b_proj.weight": (HEADS * (NOPE + ROPE), Q_RANK), f"{a}kv_a_proj_with_mqa.weight": (KV_RANK + ROPE, 2 * hidden),
              f"{a}kv_a_layernorm.weight": (KV_RANK,), f"{a}kv_b_proj.weight": (HEADS * (NOPE + V), KV_RANK),
              f"{a}o_proj.weight": (hidden, HEADS * V), "layers.0.mlp.gate_proj.weight": (INTER, hidden),
              "layers.0.mlp.up_proj.weight": (INTER, hidden), "layers.0.mlp.down_proj.weight": (hidden, INTER),
              "layers.0.input_layernorm.weight": (hidden,), "layers.0.hidden_norm.weight": (hidden,),
              "layers.0.post_attention_layernorm.weight": (hidden,), "fc.weight": (hidden, 3 * hidden),
              "norm.weight": (hidden,), "lm_head.weight": (256, hidden), "embed_tokens.weight": (768, hidden)}
    save_file({n: torch.randn(s).to(torch.bfloat16) for n, s in shapes.items()}, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps({
        "architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "kimi_k2", "hidden_size": hidden,
        "num_hidden_layers": 1, "num_attention_heads": HEADS, "q_lora_rank": Q_RANK, "kv_lora_rank": KV_RANK,
        "qk_rope_head_dim": ROPE, "qk_nope_head_dim": NOPE, "v_head_dim": V, "intermediate_size": INTER,
        "vocab_size": 768, "draft_vocab_size": 256, "tie_word_embeddings": False}))
    return out


HEADS_BY_KIND = {"llama": make_eagle3_head, "mla": make_mla_head}
QUANTIZED = {"llama": ["model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj",
                       "model.layers.0.mlp.gate_up_proj", "model.layers.0.mlp.down_proj"],
             "mla": ["model.midlayer.self_attn.fused_qkv_a_proj_with_mqa", "model.midlayer.self_attn.q_b_proj",
                     "model.midlayer.self_attn.o_proj", "model.midlayer.mlp.gate_up_proj", "model.midlayer.mlp.down_proj"]}


@pytest.mark.parametrize("kind", ["llama", "mla"])
def test_fp8_head_maps_through_sglangs_load_weights(tmp_path, kind):
    src = HEADS_BY_KIND[kind](tmp_path / "bf16")
    quantize_head(src, tmp_path / "fp8")
    tensors = load_file(tmp_path / "fp8" / "model.safetensors")
    got, dropped = sg.load(kind, tensors, QUANTIZED[kind])
    assert dropped == []  # SGLang skips an unknown name silently: the weight would stay random
    for module in QUANTIZED[kind]:  # every decoder-layer Linear loads FP8 weights with their per-channel scales
        assert all(t.dtype == torch.float8_e4m3fn for _, t in got[f"{module}.weight"]), module
        assert got[f"{module}.weight_scale"], module
    fc = got["model.fc.weight"]
    assert len(fc) == 1 and fc[0][1].dtype == torch.bfloat16 and "fc.weight_scale" not in str(list(tensors))
    assert got["lm_head.weight"][0][1].dtype == torch.bfloat16
    # SGLang's compressed-tensors ignore matching, on SGLang's own module prefixes, keeps exactly these bf16
    for module in sg.LLAMA_LINEARS if kind == "llama" else sg.MLA_LINEARS:
        assert sg.should_ignore_layer(sg.sglang_prefix(module), KEEP_BF16) == (module not in QUANTIZED[kind]), module
    if kind == "mla":
        kv_b = got["model.midlayer.self_attn.kv_b_proj.weight"][0][1]
        assert kv_b.dtype == torch.bfloat16
        sg.mla_post_load(kv_b, NOPE, V)  # SGLang's own check passes; an FP8 kv_b_proj it refuses:
        with pytest.raises(NotImplementedError):
            sg.mla_post_load(kv_b.to(torch.float8_e4m3fn), NOPE, V)


def test_fp8_weights_are_compressed_tensors_rounding_of_the_bf16_ones(tmp_path):
    src = make_mla_head(tmp_path / "bf16")
    quantize_head(src, tmp_path / "fp8")
    before, after = load_file(src / "model.safetensors"), load_file(tmp_path / "fp8" / "model.safetensors")
    name = "layers.0.mlp.down_proj.weight"
    w = before[name].float()
    deq = after[name].float() * after[name.replace("weight", "weight_scale")].float()
    assert (deq - w).norm() / w.norm() < 0.05  # e4m3 keeps 3 mantissa bits: a few percent at most
    assert after[name.replace("weight", "weight_scale")].shape == (w.shape[0], 1)  # one scale per output channel
    untouched = [n for n in before if not QUANTIZED_NAME.match(n)]
    assert {"fc.weight", "layers.0.self_attn.kv_b_proj.weight", "lm_head.weight", "embed_tokens.weight"} <= set(untouched)
    assert all(torch.equal(before[n], after[n]) for n in untouched)
    assert len(after) == len(before) + 7  # a scale for q_a, kv_a, q_b, o and the three MLP projections
    qc = json.loads((tmp_path / "fp8" / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["ignore"] == KEEP_BF16
    assert qc["config_groups"]["group_0"]["input_activations"]["dynamic"] is True


@pytest.mark.parametrize("kind", ["llama", "mla"])
def test_fp8drafter_recipe_builds_an_fp8_eagle3_head_and_records_it(kimi_shaped, tmp_path, kind):
    from qverify.quantize import build
    from qverify.quantize.eagle3 import check_eagle3
    from qverify.quantize.loader import verify_build

    head = HEADS_BY_KIND[kind](tmp_path / "head")
    res = build("fp8drafter", model=kimi_shaped, drafter=head, workdir=tmp_path / "wd", trust_remote_code=True, **KIMI_CALIB)
    assert res.manifest.drafter_kind == "eagle3"
    assert res.manifest.serving["draft_model_quantization"] == "compressed-tensors"
    assert [s.scheme for s in res.manifest.quantization] == ["drafter:FP8_DYNAMIC"]
    assert verify_build(res.build_dir, trust_remote_code=True).drafter_load.startswith("eagle3")
    assert check_eagle3(res.build_dir / "drafter", json.loads((kimi_shaped / "config.json").read_text()))["quantization"] \
        == "compressed-tensors"
    drafted = load_file(res.build_dir / "drafter" / "model.safetensors")
    assert drafted["fc.weight"].dtype == torch.bfloat16
    assert any(t.dtype == torch.float8_e4m3fn for t in drafted.values())
    # the embedded engine serves the build with its FP8 head (tests/serve/test_eagle3_engine.py: outputs)
    from qverify.serve.embedded.eagle3_head import is_eagle3_head
    from qverify.serve.embedded.engine import Engine, GenRequest
    from qverify.serve.embedded.model_loader import load_for_serving

    loaded = load_for_serving(res.build_dir, trust_remote_code=True)
    assert is_eagle3_head(loaded.drafter) and loaded.info["build_id"] == res.manifest.build_id
    assert loaded.drafter.layers[0].mlp.down_proj.quantization_scheme is not None
    req = GenRequest(prompt_ids=[5, 6, 7], max_tokens=6, ignore_eos=True)
    spec = Engine(loaded.model, loaded.tokenizer, loaded.drafter).generate([req])[0]
    assert spec.token_ids == Engine(loaded.model, loaded.tokenizer, None).generate([req])[0].token_ids
    assert spec.meta_info["spec_verify_ct"] >= 1


def test_prequantized_fp8_head_is_carried_and_its_quantization_recorded(kimi_shaped, tmp_path, sglang_parser):  # noqa: F811
    from qverify.quantize import build
    from qverify.serve import get_backend
    from qverify.serve.profile import load_profile

    fp8 = tmp_path / "fp8"
    quantize_head(make_mla_head(tmp_path / "bf16"), fp8)
    res = build("bf16", model=kimi_shaped, drafter=fp8, workdir=tmp_path / "wd", trust_remote_code=True)
    assert (res.build_dir / "drafter" / "model.safetensors").read_bytes() == (fp8 / "model.safetensors").read_bytes()
    assert res.manifest.serving["draft_model_quantization"] == "compressed-tensors"
    # the production profile's command, parsed by SGLang's own prepare_server_args, tells SGLang so
    argv = get_backend("sglang")(res.build_dir, res.manifest, load_profile("kimi-k2.6"), tmp_path / "logs",
                                 port=30123, trust_remote_code=True).node_commands(secret="sk-test-0123456789")[0]
    sa = sglang_parser(argv)
    assert sa.speculative_algorithm == "EAGLE3" and sa.speculative_draft_model_quantization == "compressed-tensors"
    with pytest.raises(BadInput, match="already FP8"):
        build("fp8drafter", model=kimi_shaped, drafter=fp8, workdir=tmp_path / "wd2", trust_remote_code=True)


def test_a_head_with_fp8_fc_is_refused(kimi_shaped, tmp_path):
    from qverify.quantize.eagle3 import check_eagle3

    fp8 = tmp_path / "fp8"
    quantize_head(make_eagle3_head(tmp_path / "bf16"), fp8)
    t = load_file(fp8 / "model.safetensors")
    t["fc.weight_scale"] = torch.ones(HIDDEN, 1, dtype=torch.bfloat16)
    save_file(t, fp8 / "model.safetensors")
    with pytest.raises(IntegrityError, match="fc.weight_scale is quantized"):
        check_eagle3(fp8, json.loads((kimi_shaped / "config.json").read_text()))
