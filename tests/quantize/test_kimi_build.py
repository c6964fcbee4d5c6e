"""Builds from a Kimi-shaped source (INT4 pack-quantized routed experts, remote-code tokenizer): real llm-compressor,
real safetensors, real reloads. The shipped experts must come through byte for byte, every extra file carried,
SGLang's KV scale written, and the build must verify and serve."""

from __future__ import annotations

import json

import pytest

from qverify.errors import BadInput
from tests.quantize.conftest import KIMI_CALIB

PRODUCTION = ("fp8kv_nvfp4shared", "fp8kv_nvfp4shared_fp8drafter")


def _digests(d):
    from qverify.quantize.manifest import hash_dir

    return hash_dir(d)


def _tensor_digests(d) -> dict[str, str]:
    """tensor name -> sha256 over all shards (shard file names may differ between source and build)."""
    return {k.split("::", 1)[1]: v for k, v in _digests(d).items() if k.split("::", 1)[0].endswith(".safetensors")
            and "/" not in k.split("::", 1)[0]}


def test_refuses_remote_code_unless_allowed(kimi_shaped, tmp_path):
    from qverify.quantize import build

    with pytest.raises(BadInput, match="remote code") as e:
        build("as_shipped", model=kimi_shaped, workdir=tmp_path)
    assert "--trust-remote-code" in e.value.fix


def test_baseline_is_the_release_byte_for_byte(kimi_built, kimi_shaped):
    res = kimi_built("as_shipped")
    src, out = _digests(kimi_shaped), _digests(res.build_dir)
    assert {k: v for k, v in src.items() if not k.startswith("drafter/")} == \
        {k: v for k, v in out.items() if not k.startswith(("drafter/", "recipe.yaml"))}
    assert res.manifest.trust_remote_code and res.manifest.source_quantization["modules"] == 48
    assert res.verify.target_load == "streamed"


@pytest.mark.parametrize("recipe", PRODUCTION)
def test_routed_experts_stay_int4_byte_for_byte(kimi_built, kimi_shaped, recipe):
    res = kimi_built(recipe)
    src, out = _tensor_digests(kimi_shaped), _tensor_digests(res.build_dir)
    shipped = {k: v for k, v in src.items() if ".mlp.experts." in k}
    assert shipped and all(k.endswith(("weight_packed", "weight_scale", "weight_shape")) for k in shipped)
    assert {k: out.get(k) for k in shipped} == shipped
    qc = json.loads((res.build_dir / "config.json").read_text())["quantization_config"]
    src_qc = json.loads((kimi_shaped / "config.json").read_text())["quantization_config"]
    assert qc["config_groups"]["group_0"] == src_qc["config_groups"]["group_0"]  # the shipped scheme, verbatim
    assert qc["config_groups"]["recipe_group_0"]["targets"] == ["re:.*shared_experts.*"]
    assert not any("shared_experts" in m for m in qc["ignore"])  # else engines would skip their NVFP4
    assert any(k.endswith("shared_experts.up_proj.weight_packed") for k in out) and qc["kv_cache_scheme"]["num_bits"] == 8
    changed = {q.scheme for q in res.manifest.quantization}
    assert {"NVFP4", "kv_cache:fp8_e4m3"} <= changed and res.manifest.source_quantization["kept"] == "byte for byte"


@pytest.mark.parametrize("recipe", PRODUCTION)
def test_extra_files_carried(kimi_built, kimi_shaped, recipe):
    from tests.fixtures.kimi_shaped import EXTRA_FILES

    res = kimi_built(recipe)
    for name in EXTRA_FILES | {"tokenizer_config.json"}:
        assert (res.build_dir / name).read_bytes() == (kimi_shaped / name).read_bytes(), name
    assert EXTRA_FILES - {"tokenization_kimi.py"} <= set(res.manifest.carried_files)


@pytest.mark.parametrize("recipe", ("as_shipped", *PRODUCTION))
def test_verify_build_passes_and_load_build_reloads_int4(kimi_built, recipe):
    """verify checks without rebuilding the model (a 1T reload would not fit a node); the local engine's loader still
    reloads a flat build with its INT4 experts and compares every tensor."""
    from qverify.quantize.loader import load_build, verify_build

    report = verify_build(kimi_built(recipe).build_dir, trust_remote_code=True)
    assert report.ok and report.target_load == "streamed" and report.compared > 0
    if recipe.endswith("fp8drafter"):
        assert report.drafter_load == "transformers"
    if recipe == PRODUCTION[0]:
        assert load_build(kimi_built(recipe).build_dir, trust_remote_code=True).checks["target"].mode == "linearized"


@pytest.mark.parametrize("value, refused", [(1.0, False), (0.0113, True), (0.25, True)])
def test_an_sglang_visible_mla_scale_other_than_one_is_refused(kimi_built, tmp_path, value, refused):
    """The production candidate carries no SGLang-visible MLA scale; one added by hand loads only if it is 1.0
    (SGLang's trtllm_mla would multiply decode logits by anything else). Exit code 4, with the fix."""
    import shutil

    import torch

    from qverify.errors import ExitCode
    from qverify.quantize.checkpoint import load_checkpoint
    from qverify.quantize.kv_scales import sglang_scales_in_dir
    from qverify.quantize.manifest import IntegrityError
    from qverify.quantize.shards import add_shard

    d = kimi_built("fp8kv_nvfp4shared").build_dir
    assert sglang_scales_in_dir(d) == {}
    tampered = tmp_path / "tampered"
    shutil.copytree(d, tampered)
    add_shard(tampered, "extra.safetensors", {"model.layers.1.self_attn.k_proj.k_scale": torch.tensor(value, dtype=torch.bfloat16)})
    if not refused:
        assert load_checkpoint(tampered)[1].sglang_kv_scales == 1
        return
    with pytest.raises(IntegrityError, match="trtllm_mla") as e:
        load_checkpoint(tampered)
    assert e.value.exit_code == ExitCode.BAD_INPUT and "rebuild" in e.value.fix


def test_verification_reloads_only_what_the_recipe_wrote(kimi_built, monkeypatch):
    """verify never rebuilds the target nor loads a copied shard: those are checked by hash; only the recipe's own
    shards (NVFP4 shared experts, SGLang's KV scales) are reloaded."""
    import safetensors

    import qverify.quantize.checkpoint as ck
    from qverify.quantize.kv_scales import SGLANG_SCALES_SHARD
    from qverify.quantize.loader import verify_build
    from qverify.quantize.shipped_build import RECIPE_SHARD

    d = kimi_built("fp8kv_nvfp4shared").build_dir
    monkeypatch.setattr(ck, "_load_linearized", lambda *a: pytest.fail("target model rebuilt"))
    opened, real = [], safetensors.safe_open
    monkeypatch.setattr(safetensors, "safe_open", lambda f, *a, **k: opened.append(f) or real(f, *a, **k))
    assert verify_build(d, trust_remote_code=True).ok
    assert sorted(f.name for f in opened if f.parent == d) == sorted(s for s in (RECIPE_SHARD, SGLANG_SCALES_SHARD) if (d / s).is_file())


def test_kimi_model_type_builds_without_running_model_code(kimi_shaped, tmp_path):
    """Kimi K2.x ships model_type `kimi_k2` with an auto_map to its own configuration/modeling code. qverify
    calibrates and reloads it as transformers' native DeepSeek-V3 (the code files are absent here, so any attempt
    to run them fails), and the build keeps the release's config.json apart from the merged quantization_config."""
    import shutil

    from qverify.quantize import build
    from qverify.quantize.loader import verify_build

    src = tmp_path / "kimi-k2"
    shutil.copytree(kimi_shaped, src)
    cfg = json.loads((src / "config.json").read_text())
    cfg |= {"model_type": "kimi_k2", "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                                                  "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"}}
    (src / "config.json").write_text(json.dumps(cfg, indent=2))
    res = build("fp8kv_nvfp4shared", model=src, workdir=tmp_path / "wd", trust_remote_code=True, **KIMI_CALIB)
    out = json.loads((res.build_dir / "config.json").read_text())
    assert out["model_type"] == "kimi_k2" and out["auto_map"] == cfg["auto_map"]
    assert out["quantization_config"]["config_groups"]["group_0"] == cfg["quantization_config"]["config_groups"]["group_0"]
    assert verify_build(res.build_dir, trust_remote_code=True).target_load == "streamed"


def test_twin_of_the_production_candidate_on_a_kimi_shaped_build(kimi_built):
    """greedy/match's reference on Kimi's layout: the candidate's target (INT4 experts as shipped, NVFP4 shared
    experts, FP8 KV, remote-code tokenizer files) with the baseline's bf16 drafter, composed and load-checked."""
    from qverify.gate.reference import twin_builds
    from qverify.quantize.twin import compose_twin
    from qverify.workdir import Workdir

    base, cand = kimi_built("as_shipped"), kimi_built("fp8kv_nvfp4shared_fp8drafter")
    wd = Workdir.at(cand.build_dir.parent.parent)
    twin = compose_twin(wd, base.manifest.build_id, cand.manifest.build_id, trust_remote_code=True)
    assert twin.verify.ok and twin.verify.drafter_load == "transformers" and twin.manifest.trust_remote_code
    assert twin.manifest.part_hashes("target") == cand.manifest.part_hashes("target")
    assert twin.manifest.part_hashes("drafter") == base.manifest.part_hashes("drafter")
    assert (twin.build_dir / "tokenization_kimi.py").read_bytes() == (cand.build_dir / "tokenization_kimi.py").read_bytes()
    hits, decided = twin_builds(wd, base.manifest.build_id, cand.manifest.build_id)
    assert decided is None and twin.manifest.build_id in hits  # others of the same content may share the workdir
    for h in hits:
        m = wd.build_manifest(h)
        assert m.part_hashes("target") == cand.manifest.part_hashes("target")
        assert m.part_hashes("drafter") == base.manifest.part_hashes("drafter")
