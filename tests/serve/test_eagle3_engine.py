"""The embedded engine serves EAGLE3 drafter heads (Llama-style and MLA, bf16 and FP8): speculative output is the
target's own, token for token; the head reads the layers SGLang captures and attends as transformers' attention
does; a head that predicts the target is accepted more than one token per verify.

Heads are tiny and random (tests/quantize's fixtures, the shapes SGLang builds); the target is tiny_model_dir."""

from __future__ import annotations

import copy

import pytest
import torch

from qverify.quantize.eagle3_fp8 import quantize_head
from qverify.serve.embedded.eagle3_draft import Eagle3Drafter, PromptRows, SeqDraft
from qverify.serve.embedded.eagle3_head import load_eagle3_head
from qverify.serve.embedded.engine import Engine, GenRequest
from qverify.serve.embedded.model_loader import load_for_serving
from qverify.serve.embedded.runner import ModelRunner
from tests.quantize.test_eagle3_drafter import make_eagle3_head
from tests.quantize.test_eagle3_fp8 import make_mla_head

HEADS = {"llama": make_eagle3_head, "mla": make_mla_head}
PROMPTS = ["def load_config(path):", "Say hello.", "x"]


@pytest.fixture(scope="module")
def target(tiny_model_dir):
    return load_for_serving(tiny_model_dir, speculative=False)


@pytest.fixture(scope="module")
def plain_output(target):
    return [r.token_ids for r in Engine(target.model, target.tokenizer, None).generate(_requests(target.tokenizer))]


def _head(tmp_path, kind: str, fp8: bool = False):
    src = HEADS[kind](tmp_path / "bf16")
    if fp8:
        quantize_head(src, tmp_path / "fp8")
    return tmp_path / ("fp8" if fp8 else "bf16")


def _requests(tok, max_tokens: int = 10) -> list[GenRequest]:
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    return [GenRequest(prompt_ids=i, max_tokens=max_tokens, ignore_eos=True) for i in ids] + \
        [GenRequest(prompt_ids=ids[0], max_tokens=max_tokens, ignore_eos=True, temperature=1.0, seed=7)]


@pytest.mark.parametrize("kind, fp8", [("llama", False), ("llama", True), ("mla", False), ("mla", True)])
def test_eagle3_speculative_output_equals_plain(target, plain_output, tmp_path, kind, fp8):
    head = load_eagle3_head(_head(tmp_path, kind, fp8), target.model)
    if fp8:  # compressed-tensors' FP8 forward on the decoder layer's Linears; fc and lm_head bf16
        assert head.layers[0].mlp.down_proj.quantization_scheme is not None
        assert getattr(head.fc, "quantization_scheme", None) is None
    spec = Engine(target.model, target.tokenizer, head)
    assert spec.speculative == "EAGLE3"
    got = spec.generate(_requests(target.tokenizer))
    assert [r.token_ids for r in got] == plain_output  # greedy and seeded sampling alike
    for r in got:  # SGLang's per-request stats: completion tokens / verify count
        assert r.meta_info["spec_accept_length"] == round(len(r.token_ids) / r.meta_info["spec_verify_ct"], 4)
    assert spec.avg_accept_length() >= 1.0


def test_a_head_that_predicts_the_target_is_accepted(target, tmp_path):
    """A target whose lm_head is zero always picks token 0 (argmax of equal logits); a head whose lm_head is zero
    drafts draft id 0 -> target id d2t[0] + 0 = 0. Every draft is accepted: 1 + spec_tokens tokens per verify."""
    model = copy.deepcopy(target.model)
    model.lm_head.weight.data.zero_()
    head = load_eagle3_head(_head(tmp_path, "mla"), model)
    head.lm_head.weight.data.zero_()
    spec = Engine(model, target.tokenizer, head, spec_tokens=4)
    got = spec.generate(_requests(target.tokenizer, max_tokens=21)[:3])
    assert all(set(r.token_ids) == {0} for r in got)
    assert all(r.meta_info == {"spec_verify_ct": 4, "spec_accept_length": 5.25} for r in got)  # (1 + 4 x 5) / 4
    assert spec.avg_accept_length() == 5.0  # tokens accepted per verify, the first (prefill) token not counted


def test_the_target_states_are_the_layers_sglang_captures(target, tmp_path):
    """[2, N // 2, N - 3] (N = 3 layers: 0, 1, 2), each the residual stream entering the layer: HF's
    hidden_states[i]; concatenated in layer order."""
    head = load_eagle3_head(_head(tmp_path, "llama"), target.model)
    assert head.capture == [0, 1, 2]
    runner = ModelRunner(target.model, 1)
    runner.capture = head.capture
    ids = target.tokenizer(PROMPTS[0], add_special_tokens=False)["input_ids"]
    runner.prefill([ids], torch.tensor([len(ids) - 1]))
    with torch.no_grad():
        hs = target.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    torch.testing.assert_close(runner.aux, torch.cat([hs[i][0] for i in (0, 1, 2)], -1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["llama", "mla"])
def test_head_attention_is_transformers_attention(target, tmp_path, kind):
    """The head's cached, per-sequence attention = transformers' own attention forward (eager, causal) on the same
    2 x hidden input, with the projections SGLang widens."""
    drafter = Eagle3Drafter(load_eagle3_head(_head(tmp_path, kind), target.model))
    layer, n = drafter.layer, 9
    g = torch.Generator().manual_seed(0)  # the input must not depend on which tests ran before
    h, pos = torch.randn(n, 2 * drafter.head.config.hidden_size, generator=g), torch.arange(n)
    q, rows = drafter._project(h, pos)
    got = layer.self_attn.o_proj(drafter._attend(q, rows))
    layer.self_attn.config._attn_implementation = "eager"
    if kind == "mla":  # transformers' MLA has a key per query head (the head's config leaves num_key_value_heads unset)
        layer.self_attn.num_key_value_groups = 1
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        want = layer.self_attn(h[None], position_embeddings=layer.rotary_emb(h[None], pos[None]), attention_mask=mask)[0][0]
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)  # fp32, another summation order
    # the last rows attended as a later step does: over the earlier rows (the cache), causal among themselves
    tail = drafter._attend(q[-3:], rows)
    torch.testing.assert_close(layer.self_attn.o_proj(tail), want[-3:], rtol=1e-3, atol=1e-4)


def test_the_server_reports_eagle3_as_sglang_does(target, tmp_path):
    """/server_info: speculative_algorithm and internal_states[0].avg_spec_accept_length; a chat answer:
    choices[0].meta_info.spec_accept_length (SGLang's places, read by qverify's own openai_http.spec_meta)."""
    from fastapi.testclient import TestClient

    from qverify.serve.embedded.model_loader import LoadedModel
    from qverify.serve.embedded.server import create_app
    from qverify.serve.openai_http import spec_meta

    head = load_eagle3_head(_head(tmp_path, "llama"), target.model)
    loaded = LoadedModel(model=target.model, tokenizer=target.tokenizer, drafter=head, served_name="t")
    with TestClient(create_app(loaded, max_batch=4)) as client:
        chat = client.post("/v1/chat/completions", json={"model": "t", "max_tokens": 6, "ignore_eos": True,
                                                         "messages": [{"role": "user", "content": "hi"}]}).json()
        info = client.get("/server_info").json()
    meta = spec_meta(chat)
    assert meta["spec_verify_ct"] >= 1 and meta["spec_accept_length"] >= 1.0
    assert info["speculative_algorithm"] == "EAGLE3" and info["internal_states"][0]["avg_spec_accept_length"] >= 1.0


@pytest.mark.parametrize("kind", ["llama", "mla"])
def test_drafting_step_by_step_equals_one_pass_over_the_sequence(target, tmp_path, kind):
    """Row j of the head reads token j + 1 and the target's states at j (SGLang's shifted draft extend): after a
    prefill and verifies accepting 0..3 tokens, the head's kept rows and each first draft equal one pass of the head
    over the whole sequence, with the target's states from transformers' own forward (output_hidden_states).
    Provisional draft rows between the verifies are overwritten, never kept."""
    head = load_eagle3_head(_head(tmp_path, kind), target.model)
    d = Eagle3Drafter(head)
    ids = target.tokenizer(PROMPTS[0], add_special_tokens=False)["input_ids"]
    seq = ids + Engine(target.model, target.tokenizer, None).generate(
        [GenRequest(prompt_ids=ids, max_tokens=12, ignore_eos=True)])[0].token_ids
    with torch.no_grad():
        hs = target.model(torch.tensor([seq]), output_hidden_states=True).hidden_states
    states = torch.cat([hs[i][0] for i in head.capture], -1)
    # the reference: every row in one pass, as if the whole sequence were a prompt
    whole = Eagle3Drafter(head).prompt_rows(tuple(seq), states).rows
    one = SeqDraft(PromptRows(torch.empty(0, d.width), states[0]), torch.empty(len(seq), d.width))
    logits, _ = Eagle3Drafter(head)._forward([one], torch.tensor(seq[1:]), states[:-1], [len(seq) - 1])
    want_draft = head.to_target_ids(logits.argmax(-1))  # [j]: what row j drafts
    P = len(ids)
    s = d.start(d.prompt_rows(tuple(ids), states[:P]), seq[P])
    last = P  # index in seq of the last token the head has been given
    for accept in (0, 2, 1, 3, 0):
        drafts = d.propose([s], 4)[0]
        assert int(drafts[0]) == int(want_draft[last - 1])
        emitted = seq[last + 1: last + 2 + accept]
        d.accepted(s, emitted, states[last: last + 1 + accept])
        last += len(emitted)
    kept = torch.cat([s.prompt.rows, s.own[: s.kept]])
    torch.testing.assert_close(kept, whole[: len(kept)], rtol=1e-4, atol=1e-5)
