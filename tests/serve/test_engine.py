"""The embedded engine against references that share none of its tricks (no cache, no absorption, no batching)."""

from __future__ import annotations

import pytest
import torch

from qverify.serve.embedded.engine import Engine, GenRequest
from qverify.serve.embedded.sampler import sample


@pytest.fixture(scope="module")
def tiny():
    from qverify.assets import default_model_dir
    from qverify.serve.embedded.model_loader import load_for_serving

    return load_for_serving(default_model_dir(), speculative=True)  # the shipped qverify-tiny (bf16 build) + drafter


def _prompts(tok, per_suite: int) -> list[list[int]]:
    from qverify.suites import get_suite

    out = []
    for name in ("coding", "toolcall", "longctx", "verifier"):
        for it in get_suite(name).items("test", per_suite):
            text = tok.apply_chat_template(it.messages, tools=it.tools, tokenize=False, add_generation_prompt=True)
            out.append(tok(text, add_special_tokens=False)["input_ids"])
    return out


@torch.no_grad()
def _plain_greedy(model, ids: list[int], n: int, eos: int) -> list[int]:
    """HF's forward over the whole sequence at every step: no cache, no absorbed attention."""
    seq = list(ids)
    for _ in range(n):
        t = int(model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].argmax())
        if t == eos:
            break
        seq.append(t)
    return seq[len(ids):]


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["qverify-kernel", "torch-flash"])
def test_greedy_equals_plain_hf_forward_on_every_held_out_item(tiny, attention, monkeypatch):
    from qverify.serve.embedded import mqa_kernel

    if attention == "torch-flash":  # what a box without a C++ compiler runs
        monkeypatch.setitem(mqa_kernel._STATE, "ext", None)
    tok = tiny.tokenizer
    prompts = _prompts(tok, 4)
    eng = Engine(tiny.model, tok, max_batch=64)
    # two replicates per prompt: the second shares the first's prefill and decode reads
    res = eng.generate([GenRequest(prompt_ids=p, max_tokens=16) for p in prompts for _ in range(2)])
    assert eng.stats["shared_prefills"] >= len(prompts)
    same = [res[2 * i].token_ids == res[2 * i + 1].token_ids == _plain_greedy(tiny.model, p, 16, tok.eos_token_id)
            for i, p in enumerate(prompts)]
    assert all(same), f"{same.count(False)} of {len(same)} items differ from the plain forward"


def test_echo_logprobs_equal_a_plain_forward(tiny):
    tok = tiny.tokenizer
    ids = _prompts(tok, 1)[2]  # a long-context prompt
    res = Engine(tiny.model, tok).generate([GenRequest(prompt_ids=ids, max_tokens=0, prompt_logprobs=3)])[0]
    with torch.no_grad():
        ref = torch.log_softmax(tiny.model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    got = torch.tensor([r["logprob"] for r in res.prompt_logprobs[1:]])
    want = ref[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert res.prompt_logprobs[0]["logprob"] is None and len(got) == len(ids) - 1
    assert torch.allclose(got, want, atol=1e-4)
    assert all(len(r["top"]) == 3 for r in res.prompt_logprobs[1:])


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_same_seed_same_tokens_whatever_shares_the_batch(tiny, batch):
    tok = tiny.tokenizer
    prompts = _prompts(tok, 2)
    probe = GenRequest(prompt_ids=prompts[6], max_tokens=24, temperature=1.0, top_p=0.9, seed=1234)  # a verifier item:
    # the model is unsure there, so seeds matter (on most coding items it is ~certain at T=1)
    alone = Engine(tiny.model, tok).generate([probe])[0].token_ids
    others = [GenRequest(prompt_ids=prompts[i % len(prompts)], max_tokens=8 + i % 20, temperature=1.0, top_p=0.9,
                         seed=i) for i in range(batch - 1)]
    res = Engine(tiny.model, tok, max_batch=64).generate(others[: batch // 2] + [probe] + others[batch // 2:])
    assert res[batch // 2].token_ids == alone
    reseeded = Engine(tiny.model, tok).generate([GenRequest(**{**probe.__dict__, "seed": s}) for s in range(8)])
    assert any(r.token_ids != alone for r in reseeded)  # the seed decides: other seeds sample other answers


def test_sampler_draws_from_the_top_p_nucleus():
    """Gumbel-max over the nucleus must give the renormalised nucleus probabilities (20,000 seeded draws)."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.0, -1.0, -3.0])
    n = 20000
    toks = sample(logits.expand(n, -1), torch.full((n,), 0.8), torch.full((n,), 0.9), torch.arange(n),
                  torch.full((n,), 5))
    p = torch.softmax(logits / 0.8, -1)
    keep = (torch.cumsum(p, 0) - p) < 0.9
    want = torch.where(keep, p, 0) / torch.where(keep, p, 0).sum()
    freq = torch.bincount(toks, minlength=6).double() / n
    assert (freq - want).abs().max() < 0.015  # binomial SE <= 0.0035: 4 SE
    assert freq[~keep].sum() == 0


def test_nucleus_draws_equal_the_whole_vocabulary_gumbel_max():
    """The sampler ranks rows in stages (top 8, top 64, all) and draws noise for the ranked tokens only; the tokens
    must be those of Gumbel-max over the whole masked vocabulary with the same (seed, step, token) noise, for
    nuclei that each stage takes, in one batch with top_p 1 and greedy rows (600 rows)."""
    from qverify.serve.embedded.sampler import uniform_noise

    g = torch.Generator().manual_seed(0)
    n, v = 600, 768
    spread = torch.tensor([12.0, 3.0, 0.4]).repeat(n // 3)[:, None]  # peaked, medium, flat rows
    logits = torch.randn(n, v, generator=g) * spread
    temp = torch.full((n,), 0.6)
    top_p = torch.full((n,), 0.95)
    top_p[::10], temp[5::10] = 1.0, 0.0  # every 10th row: the whole vocabulary; every 10th from 5: greedy
    seeds, steps = torch.randint(0, 2**40, (n,), generator=g), torch.randint(0, 100, (n,), generator=g)
    z = logits / temp.clamp(min=1e-9)[:, None]
    probs = torch.softmax(z, -1)
    sp, si = probs.sort(-1, descending=True)
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter_(1, si, (sp.cumsum(-1) - sp) < top_p[:, None])
    noise = -torch.log(-torch.log(uniform_noise(seeds, steps, v)))
    want = (z.masked_fill(~keep, float("-inf")).double() + noise).argmax(-1)
    want[5::10] = logits[5::10].argmax(-1)
    size = keep.sum(-1)[top_p < 1]
    assert (size <= 8).any() and ((size > 8) & (size <= 64)).any() and (size > 64).any()  # every stage serves
    assert torch.equal(sample(logits, temp, top_p, seeds, steps), want)


def test_speculative_greedy_and_seeded_equal_plain_in_one_batch(tiny):
    tok = tiny.tokenizer
    prompts = _prompts(tok, 2)
    reqs = lambda: [GenRequest(prompt_ids=p, max_tokens=24, temperature=t, top_p=0.95, seed=s)
                    for p in prompts for t, s in ((0.0, 0), (0.7, 5))]
    plain = Engine(tiny.model, tok).generate(reqs())
    spec_engine = Engine(tiny.model, tok, tiny.drafter, spec_tokens=3)
    spec = spec_engine.generate(reqs())
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    for r in spec:
        assert r.meta_info["spec_verify_ct"] >= 1
        assert r.meta_info["spec_accept_length"] == pytest.approx(
            (len(r.token_ids) + (r.finish_reason == "stop")) / r.meta_info["spec_verify_ct"], abs=1e-3)
    assert spec_engine.stats["steps"] < sum(len(r.token_ids) for r in plain)  # verify steps emit > 1 token


def test_short_requests_finish_while_a_long_one_continues(tiny):
    tok = tiny.tokenizer
    prompts = _prompts(tok, 1)
    eng = Engine(tiny.model, tok, max_batch=8)
    done: dict[str, int] = {}
    eng.add(GenRequest(prompt_ids=prompts[2], max_tokens=60, ignore_eos=True), lambda r, e: done.setdefault("long", step))
    step = 0
    for step in range(1, 6):
        eng.step()
    for i in range(3):  # join mid-flight
        eng.add(GenRequest(prompt_ids=prompts[i % 2], max_tokens=4, ignore_eos=True),
                lambda r, e, i=i: done.setdefault(f"short{i}", step))
    while eng.has_work():
        step += 1
        eng.step()
    assert all(done[f"short{i}"] < done["long"] for i in range(3))
    assert all(done[f"short{i}"] <= 10 for i in range(3))  # joined at step 6, finished 4 tokens later
    assert eng.stats["max_running"] == 4


@torch.no_grad()
def test_batched_moe_gives_transformers_moe_bits(tiny):
    """moe.py's sort + per-expert GEMM path must give exactly the MoE block's own output (batches 1..600), and
    must not take a block with a compressed-tensors scheme (those run as loaded)."""
    import copy

    from qverify.serve.embedded.moe import moe_forward, plain_fused_experts

    layers = [layer for layer in tiny.model.model.layers if plain_fused_experts(layer.mlp)]
    assert layers, "qverify-tiny's MoE layers should take the batched path"
    assert all(layer.mlp.gate.num_group == 1 for layer in layers)  # so moe.route()'s one-group form is what runs
    g = torch.Generator().manual_seed(0)
    for layer in layers:
        for n in (1, 7, 60, 600):
            h = torch.randn(1, n, tiny.model.config.hidden_size, generator=g)
            assert torch.equal(moe_forward(layer.mlp, h), layer.mlp(h))
    marked = copy.deepcopy(layers[0].mlp)
    marked.experts.quantization_scheme = object()
    assert not plain_fused_experts(marked)


def test_banned_tokens_are_never_sampled_per_row():
    """Each row's banned ids are masked for that row only (the batch's bans are one scatter)."""
    from qverify.serve.embedded.engine import Engine
    from qverify.serve.embedded.sequence import Seq

    logits = torch.zeros(3, 8)
    logits[:, 5] = 10.0  # every row's greedy pick is 5 unless banned
    seqs = [Seq(GenRequest([1], 1, bad_token_ids=b), done=lambda *a: None, seed=0) for b in ([5], [], [5, 6])]
    toks = Engine._sample(None, seqs, logits, torch.zeros(3, dtype=torch.long))
    assert toks[0] != 5 and toks[1] == 5 and toks[2] not in (5, 6)
