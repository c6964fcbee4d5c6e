"""Quantized builds on the engine: compressed-tensors' forward is the reference; the FP8 latent is SGLang's.

Builds are real llm-compressor runs on a tiny random DeepSeek-V3 (tests/conftest.py), loaded through qverify's
integrity-checked loader exactly as the server loads them.
"""

from __future__ import annotations

import pytest
import torch

from qverify.quantize.kv_scales import FP8_E4M3_MAX
from qverify.serve.embedded.runner import ModelRunner

CALIB = {"calib_samples": 16, "calib_seq_len": 128}


@pytest.fixture(scope="module")
def built(tiny_model_dir, tmp_path_factory):
    from qverify.quantize import build

    workdir, cache, dirs, refs = tmp_path_factory.mktemp("workdir"), {}, {}, {}

    def get(recipe: str):
        """The build as the server loads it (model_loader: compressed-tensors' forward prepared for serving)."""
        if recipe not in cache:
            from qverify.serve.embedded.model_loader import load_for_serving

            dirs[recipe] = build(recipe, model=tiny_model_dir, workdir=workdir, **CALIB).build_dir
            cache[recipe] = load_for_serving(dirs[recipe], speculative=False)
        return cache[recipe]

    def reference(recipe: str):
        """The same build loaded separately and left as compressed-tensors returns it: the reference forward."""
        if recipe not in refs:
            get(recipe)
            refs[recipe] = reference_model(dirs[recipe])
        return refs[recipe]

    get.reference = reference
    return get


def reference_model(build_dir):
    from qverify.quantize.loader import load_build

    return load_build(build_dir, trust_remote_code=True).model.to(torch.float32).eval()  # as load_for_serving casts it


@pytest.fixture(scope="module")
def ids(built):
    tok = built("nvfp4shared").tokenizer
    return tok("def load_config(path):\n    with open(path) as f:\n        return json.load(f)\n",
               add_special_tokens=False)["input_ids"]


@torch.no_grad()
def engine_logits(runner: ModelRunner, ids: list[int], n_prompt: int) -> torch.Tensor:
    """Logits at every position: prefill of the first n_prompt tokens, then one absorbed decode step per token."""
    kvs, logits = runner.prefill([ids[:n_prompt]], torch.arange(n_prompt))
    out = [logits]
    for j in range(n_prompt, len(ids)):
        out.append(runner.decode(torch.tensor([[ids[j]]]), torch.tensor([[j]]), torch.tensor([j - n_prompt]),
                                 [(kvs[0], torch.tensor([0]))])[0])
    return torch.cat(out)


@torch.no_grad()
def hf_logits(model, ids: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


def assert_logits_close(got: torch.Tensor, want: torch.Tensor, recipe: str) -> float:
    """Engine vs compressed-tensors logits; returns the error the quantization's own effect must exceed."""
    diff, scale = (got - want).abs(), want.abs().max().item()
    err = diff.max().item()
    if recipe == "nvfp4_all":
        # Every Linear's input is fake-quantized to FP4 here, kv_b_proj's included, and the absorbed form feeds it
        # values summed in another order: a value on an FP4 rounding boundary may round the other way (it depends
        # even on the GEMM's thread count: 1 thread gives 2.5% at one position, 2 threads ~0). So the bound is on
        # the typical position, plus a looser cap for the rare flipped one.
        assert diff.mean().item() < 2e-3 * scale and err < 5e-2 * scale, f"max |engine - ct| = {err}, mean {diff.mean()}"
        return diff.mean().item()
    assert err < 2e-3 * scale, f"max |engine - compressed-tensors| = {err}"
    return err


@pytest.mark.parametrize("recipe, scale_mode", [("nvfp4shared", "production"), ("nvfp4_all", "production"),
                                                ("fp8kv_nvfp4shared", "compressed-tensors")])
def test_logits_match_compressed_tensors_forward(built, ids, recipe, scale_mode):
    """NVFP4 fake quant (shared experts; every Linear incl. an absorbed NVFP4 kv_b_proj), and FP8 KV with
    compressed-tensors' own k/v scale pair: same logits as HF + compressed-tensors' forward, prefill and decode."""
    lm = built(recipe)
    runner = ModelRunner(lm.model, slots=4, fp8_kv=lm.fp8_kv, scale_mode=scale_mode)
    assert runner.fp8_kv == recipe.startswith("fp8kv")
    ref = built.reference(recipe)
    got, want = engine_logits(runner, ids, 12), hf_logits(ref, ids)
    assert got.shape == want.shape
    err = assert_logits_close(got, want, recipe)
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.98
    # and the quantization is really in both: switching it off moves the reference and the served model
    from qverify.quantize.loader import set_quantization_enabled

    for model in (ref, lm.model):
        set_quantization_enabled(model, False)
        try:
            assert (hf_logits(model, ids) - want).abs().max().item() > 10 * err
        finally:
            set_quantization_enabled(model, True)


def _hf_latent(model, ids: list[int], layer: int) -> torch.Tensor:
    """The unquantized latent HF computes (512 after kv_a_layernorm, 64 rope key after rope), caught on its way
    into compressed-tensors' QuantizedKVCache."""
    seen = {}
    attn = model.model.layers[layer].self_attn

    def grab(mod, args, kwargs):
        k, v = (list(args) + [kwargs.get("key_states"), kwargs.get("value_states")])[:2]
        seen["latent"] = torch.cat([k[0, 0], v[0, 0]], -1).float()

    h = attn.kv_cache.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        h.remove()
    return seen["latent"]


def _fp8_reference(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Direct quantize / dequantize: x / s, clamp to the e4m3 range, round to float8_e4m3fn, times s."""
    return (x / scale).clamp(-448, 448).to(torch.float8_e4m3fn).to(torch.float32) * scale


@pytest.mark.parametrize("recipe", ["fp8kv", "fp8kv_badscale"])
def test_fp8_latent_is_a_scale_one_cast_of_all_576_values(built, ids, recipe):
    """SGLang casts the latent to FP8 with scale 1, whatever compressed-tensors' pair in the build (kv_fp8.py): layer 0's cache
    is HF's unquantized latent through a plain e4m3 round trip (no value clips), and every layer's rows are e4m3 values.
    (Later layers differ from HF + compressed-tensors by design: SGLang's prefill attends over the unrounded latent.)"""
    lm = built(recipe)
    runner = ModelRunner(lm.model, slots=2, fp8_kv=lm.fp8_kv)
    kvs, _ = runner.prefill([ids], torch.tensor([len(ids) - 1]))
    for layer in range(len(runner.mla)):
        assert torch.equal(runner.mla[layer].kv_scale, torch.ones(576))
        rows = kvs[0].rows[layer]
        assert torch.equal(_fp8_reference(rows, 1.0), rows)  # already e4m3 values at scale 1
    raw = _hf_latent(lm.model, ids, 0)
    want, got = _fp8_reference(raw, 1.0), kvs[0].rows[0]
    # equal, up to an fp8 rounding boundary crossed by float noise in the latent itself
    assert (got == want).float().mean() > 0.995
    bad = (got - want).abs() > 0.125 * want.abs() + 2 ** -9 + 1e-4 * raw.abs().max()
    assert not bad.any(), (got[bad][:5], want[bad][:5], raw[bad][:5])
    assert not torch.equal(got, raw)  # really rounded
    assert raw.abs().max() < FP8_E4M3_MAX  # nothing clips at scale 1


def test_badscale_moves_decode_logits_not_prefill(built, ids):
    """The control's SGLang-visible k_scale (0.25) reaches the engine as trtllm_mla applies it: the prompt's logits
    (prefill) are fp8kv's exactly, every decoded position's are not; flashinfer ignores it."""
    good, bad = built("fp8kv"), built("fp8kv_badscale")
    assert bad.sglang_kv_scales == dict.fromkeys(range(len(bad.model.model.layers)), 0.25) and not good.sglang_kv_scales
    n = 12
    ref = engine_logits(ModelRunner(good.model, slots=2, fp8_kv=True), ids, n)
    got = engine_logits(ModelRunner(bad.model, slots=2, fp8_kv=True, sglang_scales=bad.sglang_kv_scales), ids, n)
    assert torch.equal(got[:n], ref[:n])
    # on this random-weight model attention is nearly uniform, so x0.25 moves logits ~1% (measured 0.7-1.3%), far
    # beyond float noise; on the trained qverify-tiny it fails the gate (docs/build.md)
    assert ((got[n:] - ref[n:]).abs().amax(-1) > 2e-3 * ref[n:].abs().amax(-1)).all()
    flash = engine_logits(ModelRunner(bad.model, slots=2, fp8_kv=True, sglang_scales=bad.sglang_kv_scales,
                                      attention_backend="flashinfer"), ids, n)
    plain = engine_logits(ModelRunner(good.model, slots=2, fp8_kv=True, attention_backend="flashinfer"), ids, n)
    assert torch.equal(flash, plain)


def test_backends_the_engine_does_not_emulate_are_refused(built):
    from qverify.errors import BadInput
    from qverify.serve.embedded.kv_fp8 import layer_fp8

    attn = built("fp8kv").model.model.layers[0].self_attn
    with pytest.raises(BadInput, match="fa3"):
        layer_fp8(attn, 0, backend="fa3")
    ct = layer_fp8(attn, 0, mode="compressed-tensors")  # compressed-tensors' pair, for the HF comparison only
    k, v = float(attn.k_scale.detach()), float(attn.v_scale.detach())
    assert torch.equal(ct.cache_scale[:512], torch.full((512,), k)) and torch.equal(ct.cache_scale[512:], torch.full((64,), v))


def test_no_quant_switches_the_fp8_latent_off(built, ids):
    lm = built("fp8kv")
    from qverify.quantize.loader import set_quantization_enabled

    set_quantization_enabled(lm.model, False)
    try:
        assert not ModelRunner(lm.model, slots=2, fp8_kv=lm.fp8_kv).fp8_kv
    finally:
        set_quantization_enabled(lm.model, True)


@pytest.mark.parametrize("recipe, scale_mode", [("as_shipped", "production"), ("fp8kv_nvfp4shared", "compressed-tensors")])
def test_kimi_shaped_int4_experts_match_compressed_tensors_forward(kimi_shaped, tmp_path, recipe, scale_mode):
    """A Kimi-shaped release (INT4 W4A16 pack-quantized routed experts, loaded linearized): the engine calls those
    expert modules, so its logits are compressed-tensors' own, prefill and decode."""
    from qverify.quantize import build
    from qverify.serve.embedded.model_loader import load_for_serving

    res = build(recipe, model=kimi_shaped, workdir=tmp_path / "wd", trust_remote_code=True, **{
        "calib_samples": 8, "calib_seq_len": 64})
    lm = load_for_serving(res.build_dir, speculative=False, trust_remote_code=True)
    assert any("weight_packed" in k or "weight_scale" in k for k in lm.model.state_dict() if ".experts." in k)
    ids = lm.tokenizer("def load_config(path):\n    return json.load(open(path))\n", add_special_tokens=False)["input_ids"]
    runner = ModelRunner(lm.model, slots=2, fp8_kv=lm.fp8_kv, scale_mode=scale_mode)
    got, want = engine_logits(runner, ids, len(ids) // 2), hf_logits(reference_model(res.build_dir), ids)
    err = (got - want).abs().max().item()
    assert err < 2e-3 * want.abs().max().item(), f"max |engine - compressed-tensors| = {err}"


def test_an_fp8_drafter_is_absorbed_and_speculates(tmp_path):
    """FP8_DYNAMIC quantizes the drafter's kv_b_proj input; the engine once refused to absorb it, so the server
    died at start-up on every FP8-drafter build. Absorbed as SGLang absorbs it, the drafter must still be
    greedy-identical and accept more than one token per verify step."""
    from qverify.quantize import build
    from qverify.assets import default_model_dir
    from qverify.serve.embedded.engine import Engine, GenRequest
    from qverify.serve.embedded.model_loader import load_for_serving
    from qverify.suites import get_suite

    lm = load_for_serving(build("fp8drafter", model=default_model_dir(), workdir=tmp_path / "wd", **CALIB).build_dir,
                          speculative=True)
    assert lm.drafter is not None
    assert lm.drafter.model.layers[0].self_attn.kv_b_proj.quantization_scheme.input_activations is not None
    tok = lm.tokenizer
    prompts = [tok(tok.apply_chat_template(it.messages, tools=it.tools, tokenize=False, add_generation_prompt=True),
                   add_special_tokens=False)["input_ids"] for s in ("coding", "toolcall") for it in get_suite(s).items("test", 3)]
    reqs = lambda: [GenRequest(prompt_ids=p, max_tokens=32, temperature=0.0) for p in prompts]
    plain = Engine(lm.model, tok).generate(reqs())
    spec = Engine(lm.model, tok, lm.drafter, spec_tokens=4).generate(reqs())
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    assert sum(r.meta_info["spec_accept_length"] for r in spec) / len(spec) > 2.5  # the bf16 drafter: ~4 here


def _first_token_logprobs(engine, reqs):
    return [torch.tensor(sorted(r.logprobs[0]["top"].values())) for r in engine.generate(reqs)]


def test_a_generation_request_reads_its_prompt_prefix_back_from_the_fp8_pool(built, ids):
    """Issue #36.5: SGLang serves a cached prompt prefix (an item's later replicates, a previous turn) from its radix
    cache, and trtllm_mla prefills the last tokens over the prefix read back from the FP8 pool (prefix_reads.py). The
    engine reads every generation request's prompt so, whatever its arrival order: 64-token pages, so 128 of 129
    tokens cached; computed once for every request of the prompt, together or later."""
    from qverify.serve.embedded.engine import Engine, GenRequest
    from qverify.serve.embedded.prefix_reads import cached_prefix_len

    lm = built("fp8kv")
    prompt = (ids * 8)[:129]
    m = cached_prefix_len(len(prompt), "trtllm_mla")
    assert m == 128

    def req(**kw):
        return GenRequest(prompt_ids=prompt, max_tokens=2, want_logprobs=True, top_logprobs=5, **kw)

    eng = Engine(lm.model, lm.tokenizer, fp8_kv=True)
    together = _first_token_logprobs(eng, [req(), req(), req()])
    later = _first_token_logprobs(eng, [req()])[0]  # arriving after the others finished
    assert eng.stats["prefix_hits"] == 1  # one view, computed once for every request
    runner = ModelRunner(lm.model, slots=2, fp8_kv=True)
    kvs, fresh = runner.prefill([prompt], torch.tensor([len(prompt) - 1]))
    _, hit = runner.extend(kvs[0], m, prompt[m:], torch.tensor([len(prompt) - m - 1]))
    top = lambda logits: torch.log_softmax(logits[0], -1).topk(5).values.sort().values
    for got in (*together, later):
        assert torch.allclose(got, top(hit), atol=1e-5)
    assert (top(hit) - top(fresh)).abs().max() > 1e-4  # the FP8-rounded prefix moves the first token's distribution
    # an echo request (the kld suite) never hits in SGLang (logprob_start_len 0): the fresh prefill's rows
    echo = Engine(lm.model, lm.tokenizer, fp8_kv=True).generate([req(prompt_logprobs=2), req(prompt_logprobs=2)])
    assert echo[0].logprobs == echo[1].logprobs
    assert torch.allclose(torch.tensor(sorted(echo[0].logprobs[0]["top"].values())), top(fresh), atol=1e-5)
    # a bf16 cache gives back what it was given: no view
    bf16 = built("nvfp4shared")
    plain = Engine(bf16.model, bf16.tokenizer, fp8_kv=bf16.fp8_kv)
    a, b = _first_token_logprobs(plain, [req(), req()])
    assert torch.equal(a, b) and plain.stats["prefix_hits"] == 0


def test_a_long_prompt_is_prefilled_in_chunks_over_the_fp8_pool(built, ids):
    """SGLang's chunked prefill: past chunked_prefill_size, each chunk reads the ones before back from the pool."""
    from qverify.serve.embedded.engine import Engine, GenRequest

    lm = built("fp8kv")
    prompt = (ids * 8)[:100]
    req = GenRequest(prompt_ids=prompt, max_tokens=1, prompt_logprobs=1)
    whole, chunked = (Engine(lm.model, lm.tokenizer, fp8_kv=True, chunked_prefill_size=c).generate([req])[0]
                      for c in (None, 64))
    lp = [[r["logprob"] for r in x.prompt_logprobs[1:]] for x in (whole, chunked)]
    assert lp[0][:63] == lp[1][:63]  # the first chunk is the same prefill
    assert max(abs(a - b) for a, b in zip(lp[0][63:], lp[1][63:])) > 1e-4
