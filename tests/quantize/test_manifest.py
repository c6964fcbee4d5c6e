"""Manifest pieces: raw-byte tensor hashes, truncation, KV bytes/token for MLA and GQA."""

from __future__ import annotations

import pytest

from qverify.quantize.manifest import IntegrityError, kv_bytes_per_token, tensor_digests


def test_kv_bytes_mla_and_gqa():
    mla = {"num_hidden_layers": 3, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "dtype": "bfloat16"}
    assert kv_bytes_per_token(mla, "bf16") == 3 * 576 * 2
    assert kv_bytes_per_token(mla, "fp8_e4m3") == 3 * 576
    gqa = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}
    assert kv_bytes_per_token(gqa, "bf16") == 2 * 32 * 8 * 128 * 2


def test_tensor_digests_match_torch_bytes_and_catch_truncation(tmp_path):
    import hashlib

    import torch
    from safetensors.torch import save_file

    t = {"a": torch.arange(10, dtype=torch.float32), "b": torch.ones(3, 3, dtype=torch.bfloat16)}
    p = tmp_path / "x.safetensors"
    save_file(t, p)
    d = tensor_digests(p)
    assert d["a"] == hashlib.sha256(t["a"].numpy().tobytes()).hexdigest()
    p.write_bytes(p.read_bytes()[:-4])
    with pytest.raises(IntegrityError, match="truncated"):
        tensor_digests(p)
