"""Assisted generation with the drafter must reproduce plain greedy output, and report accept lengths."""

from __future__ import annotations

from qverify.serve.embedded.engine import Engine, GenRequest
from qverify.serve.embedded.model_loader import load_for_serving
from tests import parrot


def test_assisted_greedy_equals_plain_greedy(parrot_dir):
    spec = load_for_serving(parrot_dir, speculative=True)
    plain = load_for_serving(parrot_dir, speculative=False)
    assert spec.drafter is not None and plain.drafter is None
    tok = spec.tokenizer
    e_spec, e_plain = Engine(spec.model, tok, spec.drafter), Engine(plain.model, tok, None)
    prompts = [tok.apply_chat_template(m, tools=t, tokenize=False, add_generation_prompt=True)
               for m, t, _ in parrot.conversations()] + ["def load_config(path):"]
    for p in prompts:
        ids = tok(p, add_special_tokens=False)["input_ids"]
        a = e_spec.generate([GenRequest(prompt_ids=ids, max_tokens=24)])[0]
        b = e_plain.generate([GenRequest(prompt_ids=ids, max_tokens=24)])[0]
        assert a.token_ids == b.token_ids
        assert a.meta_info["spec_verify_ct"] >= 1 and a.meta_info["spec_accept_length"] >= 1.0
    assert e_spec.avg_accept_length() >= 1.0
