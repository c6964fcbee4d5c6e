"""Weight bytes from real checkpoints: the config estimate must equal the bytes on disk.

The quantized checkpoints are written by real llm-compressor `oneshot` runs on a tiny
DeepSeek-V3 model, so the scale layouts priced in qverify.capacity.schemes are checked
against what compressed-tensors actually saves.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

from qverify.capacity import checkpoint_weights, estimate_weights, plan
from qverify.errors import BadInput

torch.set_num_threads(1)
QUANTIZABLE = ("attention", "dense_mlp", "routed_experts", "shared_experts")


def _tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(256)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t0")), unk_token="t0")


@pytest.fixture(scope="module")
def deepseek_src(tmp_path_factory) -> Path:
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    # MLA + 4 routed experts + 1 shared, dims divisible by the 16 / 32 quantization groups
    cfg = DeepseekV3Config(
        vocab_size=256, hidden_size=128, intermediate_size=256, moe_intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2,
        first_k_dense_replace=1, n_group=1, topk_group=1, kv_lora_rank=64, q_lora_rank=None, qk_rope_head_dim=32,
        qk_nope_head_dim=32, v_head_dim=32, tie_word_embeddings=False, num_mtp_layers=0,
    )
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("deepseek_bf16")
    AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(out)
    return out


def test_llama_checkpoint_bytes_equal_the_estimate(tmp_path):
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(tmp_path)
    disk = checkpoint_weights(tmp_path)
    params = sum(p.numel() for p in model.parameters())
    assert disk.total_bytes == 2 * params == disk.bytes_by_dtype["BF16"]
    est = estimate_weights(json.loads((tmp_path / "config.json").read_text()), {})
    assert est.total_params == params and est.total_bytes == disk.total_bytes


@pytest.mark.parametrize(("modifier", "scheme"), [
    ({"scheme": "NVFP4"}, "nvfp4"),
    ({"scheme": "FP8_DYNAMIC"}, "fp8"),
    ({"scheme": "FP8"}, "fp8_tensor"),
    ({"config_groups": {"g": {"targets": ["Linear"], "weights": {
        "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}}}}, "int4_g32"),
])
def test_quantized_checkpoint_bytes_equal_the_estimate(deepseek_src, tmp_path, modifier, scheme):
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(deepseek_src, dtype=torch.bfloat16)
    recipe = QuantizationModifier(targets="Linear", ignore=["lm_head"], **modifier) if "scheme" in modifier \
        else QuantizationModifier(ignore=["lm_head"], **modifier)
    calib = Dataset.from_dict({"input_ids": [list(range(1, 33))] * 4, "attention_mask": [[1] * 32] * 4})
    oneshot(model=model, dataset=calib, recipe=recipe, processor=_tokenizer(), num_calibration_samples=4, max_seq_length=32)
    model.save_pretrained(tmp_path, save_compressed=True)

    disk = checkpoint_weights(tmp_path)
    est = estimate_weights(json.loads((tmp_path / "config.json").read_text()), {c: scheme for c in QUANTIZABLE})
    assert est.total_bytes == disk.total_bytes, (scheme, disk.bytes_by_dtype)


def test_build_dir_weights_drive_the_plan(deepseek_src):
    disk = checkpoint_weights(deepseek_src)
    cfg = json.loads((deepseek_src / "config.json").read_text())
    p = plan(cfg, "bf16", weights=disk, gpu="h100", hbm_gb=80, tp=1, mem_fraction=1.0, cuda_context_gb=0)
    assert p.weights.source == "checkpoint" and p.weights_per_gpu_bytes == disk.total_bytes
    # 2 layers x (64 + 32) x bf16 per token; SGLang's w_kc/w_vc copies of kv_b_proj load beside the weights
    assert p.kv_tokens_per_replica == (80 * 10**9 - disk.total_bytes - p.mla_copies_per_gpu_bytes) // (2 * 96 * 2)
    assert p.mla_copies_per_gpu_bytes > 0


def test_corrupt_or_missing_safetensors(tmp_path):
    with pytest.raises(BadInput, match="no \\*.safetensors"):
        checkpoint_weights(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 50) + b"{not json")
    with pytest.raises(BadInput, match="truncated"):
        checkpoint_weights(tmp_path)
