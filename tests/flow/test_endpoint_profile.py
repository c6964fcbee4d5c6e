"""A profile's model settings apply whichever backend reaches the model (issue 40.2), and a run manifest records the
sampling its requests carried (issue 40.4)."""

from __future__ import annotations

import pytest

from qverify.errors import BadInput
from qverify.serve.profile import resolve_profile
from qverify.suites import get_suite


@pytest.mark.parametrize("args", [{"backend": "endpoint", "endpoint": "http://127.0.0.1:1"},
                                  {"endpoint": "http://127.0.0.1:1"}])
def test_kimi_profile_on_an_endpoint_keeps_the_models_settings_and_drops_the_launch(args):
    """Before: "profile 'kimi-k2.6' is for the sglang backend, not endpoint", exit 4; without the profile a run sent
    no chat_template_kwargs (Kimi thinks by default) and the tiny model's output budgets."""
    prof = resolve_profile(profile="kimi-k2.6", **args)
    assert prof.backend == "endpoint" and prof.endpoint == "http://127.0.0.1:1" and prof.name == "kimi-k2.6"
    assert prof.chat_template_kwargs == {"thinking": False} and prof.max_tokens["toolcall"] == 512
    assert prof.flags == {} and prof.tp == 1 and prof.api_key_env == "QVERIFY_API_KEY"  # no SGLang flag reaches it
    with pytest.raises(BadInput, match="--endpoint applies to the endpoint backend"):
        resolve_profile(backend="sglang", profile="kimi-k2.6", endpoint="http://127.0.0.1:1")
    with pytest.raises(BadInput, match="is for the sglang backend, not local"):
        resolve_profile(backend="local", profile="kimi-k2.6")


def test_requests_and_the_manifest_carry_the_profiles_budget():
    """The manifest's sampling is what was sent: the profile's 512, not toolcall's default 96 (before: 96 recorded,
    512 sent). kld's one scored token stays 1."""
    prof = resolve_profile(backend="endpoint", profile="kimi-k2.6", endpoint="http://127.0.0.1:1")
    suite = get_suite("toolcall", **prof.request_options("toolcall"))
    body = suite.request(suite.items("test", 1)[0])
    assert body["max_tokens"] == 512 and body["chat_template_kwargs"] == {"thinking": False}
    assert suite.sent_sampling().max_tokens == 512 and suite.sampling.max_tokens == 96
    kld = get_suite("kld", **prof.request_options("kld"))
    assert kld.sent_sampling().max_tokens == 1


def test_the_documented_endpoint_profile_parses(tmp_path):
    """docs/serve.md's one-line endpoint profile is a valid profile file."""
    import re
    from pathlib import Path

    from qverify.serve.profile import parse_profile

    doc = (Path(__file__).resolve().parents[2] / "docs" / "serve.md").read_text()
    yaml_text = re.search(r"`(\{backend: endpoint, chat_template_kwargs:[^`]*)`", doc)[1]
    prof = parse_profile(yaml_text)
    assert prof.backend == "endpoint" and prof.request_options("coding") == {
        "chat_template_kwargs": {"thinking": False}, "max_tokens": 1024}
