"""The pipeline's data model round-trips through JSON, and ids are content hashes."""

from __future__ import annotations

import pytest

from qverify.models import (BuildManifest, CandidateReport, GateReport, Item, ItemResult, MetricResult, Response,
                            RunManifest, Sampling, SchemeSummary, ServingProfile, ToolCall)

SAMPLES = [
    BuildManifest(build_id="fp8kv-abc", recipe="fp8kv", recipe_hash="h", recipe_text="x: 1", source_model="/m",
                  source_hash="s", quantization=[SchemeSummary(scheme="NVFP4", targets=["re:.*shared.*"], modules=3, params=99)],
                  bytes_by_dtype={"bfloat16": 10}, kv_dtype="fp8_e4m3", kv_bytes_per_token=1728,
                  tensor_hashes={"model.safetensors::w": "00"}),
    ServingProfile(name="b200-tp4", backend="sglang", tp=4, flags={"kv_cache_dtype": "fp8_e4m3"}, api_key_env="KEY"),
    Item.make("toolcall", "test", messages=[{"role": "user", "content": "hi"}], tools=[{"type": "function"}],
              target={"calls": []}, metadata={"kind": "irrelevant"}),
    ItemResult(item_id="i", suite="toolcall", replicate=2, seed=7, request_hash="r",
               response=Response(content=None, tool_calls=[ToolCall(id="functions.f:0", name="f", arguments="{}")],
                                 finish_reason="tool_calls", usage={"prompt_tokens": 3}),
               scores={"exact_call": 1.0}, latency_s=0.5),
    RunManifest(build_id="b", suite="coding", suite_version="1", item_set_hash="h", n_items=3, replicates=3,
                sampling=Sampling(temperature=0.6), serving=ServingProfile()),
    GateReport(gate_id="g", baseline="b", verdict="FAIL", candidates=[CandidateReport(
        build_id="c", recipe="nvfp4_all", verdict="FAIL", metrics=[MetricResult(
            metric="coding/pass@1", baseline_mean=0.5, candidate_mean=0.2, delta=-0.3, ci_low=-0.4, ci_high=-0.2,
            noise_band=0.02, tolerance=0.03, mde=0.05, verdict="FAIL", reason="the whole CI lies below −0.05")])]),
]


@pytest.mark.parametrize("obj", SAMPLES, ids=lambda o: type(o).__name__)
def test_json_round_trip(obj):
    again = type(obj).model_validate_json(obj.model_dump_json())
    assert again == obj


def test_unknown_fields_are_rejected():
    with pytest.raises(ValueError):
        ServingProfile.model_validate({"backend": "local", "tpp": 4})


def test_item_id_is_a_content_hash():
    a = Item.make("coding", "test", messages=[{"role": "user", "content": "x"}])
    b = Item.make("coding", "test", messages=[{"role": "user", "content": "x"}], metadata={"level": 3})
    c = Item.make("coding", "test", messages=[{"role": "user", "content": "y"}])
    assert a.id == b.id != c.id and a.id.startswith("coding-")


def test_endpoint_never_serialises_the_api_key():
    from qverify.models import Endpoint

    ep = Endpoint(base_url="http://x/v1", model="m", api_key="sk-secret")
    assert "sk-secret" not in ep.model_dump_json() and "sk-secret" not in repr(ep)
