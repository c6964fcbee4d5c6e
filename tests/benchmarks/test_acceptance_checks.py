"""The GPU acceptance run's rules (benchmarks/gpu/acceptance_checks.py) on recorded outputs, a pass and a FAIL each.

Logprob lists: `acceptance_records.json`, recorded from the embedded engine on CPU by record_acceptance.py (no GPU has
run: the engine at each build's SGLang-visible k_scale on trtllm_mla stands in for the server; the bf16 noise is the
HF fp32-vs-bf16 gap the run measures on the host). Server and gate outputs: the shapes SGLang 0.5.23 and
`qverify gate --json` return, built through their own schemas where qverify has one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.gpu import acceptance_checks as c

REC = json.loads(Path(__file__).with_name("acceptance_records.json").read_text())


def _flat(key: str) -> list[float]:
    return [x for row in REC.values() for x in row[key]]


def _gaps(a: str, b: str) -> list[float]:
    return c.gaps(_flat(a), _flat(b))


def test_tolerance_is_the_stated_formula():
    noise, fp8 = [0.01, 0.03], [0.2, 0.4]
    assert c.tolerance(noise) == pytest.approx(3.0 * 0.02 + 1e-3)
    assert c.tolerance(noise, fp8) == pytest.approx(3.0 * 0.02 + 0.25 * 0.3 + 1e-3)


def test_engine_agrees_passes_the_served_build_and_fails_the_wrongly_served_one():
    tol = c.tolerance(_flat("noise"), _gaps("fp8", "fp8_plain"))
    # the server applied 0.25 (badscale on trtllm_mla) and the engine too: agree
    assert c.engine_agrees(_gaps("badscale_k025", "badscale_k025"), tol).status == "ok"
    assert c.engine_agrees([x * 0.9 for x in _flat("noise")], tol).status == "ok"  # noise-sized gaps
    # the server applied 0.25, the engine assumed 1.0: nats apart
    bad = c.engine_agrees(_gaps("badscale_k025", "badscale_k1"), tol)
    assert bad.failed and "mean |Δ logprob|" in bad.detail
    assert c.engine_agrees([], tol).failed


def test_the_comparison_can_tell_fp8_from_bf16_kv():
    tol = c.tolerance(_flat("noise"), _gaps("fp8", "fp8_plain"))
    noise = _flat("noise")
    # a server computing FP8 as the engine does: the engine's FP8 path within noise, its plain path far off
    assert c.fp8_emulation_needed(noise, _gaps("fp8", "fp8_plain"), tol).status == "ok"
    # a server whose FP8 the engine does not reproduce: both engine paths equally far
    far = _gaps("fp8", "fp8_plain")
    assert c.fp8_emulation_needed(far, far, tol).failed
    # too small an FP8 effect to tell: reported, not failed
    assert c.fp8_emulation_needed([0.001], [0.002], tol).status == "info"


def test_live_k_scale_reads_the_served_scale():
    tol = c.tolerance(_flat("noise"), _gaps("fp8", "fp8_plain"))
    served_025 = {1.0: _gaps("badscale_k025", "badscale_k1"), 0.25: [x * 0.5 for x in _flat("noise")]}
    assert c.live_k_scale(served_025, 0.25, "trtllm_mla", tol).status == "ok"
    # the same server, where 1.0 was declared (an fp8kv build whose scale leaked): FAIL
    wrong = c.live_k_scale(served_025, 1.0, "trtllm_mla", tol)
    assert wrong.failed and "live k_scale 0.25" in wrong.detail
    # flashinfer ignores the scale: both candidates fit, and if one does not, the server applied something
    same = {1.0: [x * 0.5 for x in _flat("noise")], 0.25: [x * 0.5 for x in _flat("noise")]}
    assert c.live_k_scale(same, 0.25, "flashinfer", tol).status == "ok"
    assert c.live_k_scale(served_025, 0.25, "flashinfer", tol).failed
    # best fit right but not clearly apart from the runner-up
    close = {1.0: [tol * 0.5], 0.25: [tol * 0.4]}
    assert c.live_k_scale(close, 0.25, "trtllm_mla", tol).failed


def _report(bad: str, cand: str) -> dict:
    from qverify.models import CandidateReport, GateReport

    cands = [CandidateReport(build_id="fp8kv_badscale-1", recipe="fp8kv_badscale", verdict=bad),
             CandidateReport(build_id="cand-1", recipe="fp8kv_nvfp4shared_fp8drafter", verdict=cand)]
    return GateReport(gate_id="g", baseline="bf16-1", verdict="FAIL", candidates=cands).model_dump(mode="json")


@pytest.mark.parametrize("bad, cand, backend, status", [
    ("FAIL", "PASS", "trtllm_mla", "ok"), ("FAIL", "INCONCLUSIVE", "trtllm_mla", "ok"),
    ("PASS", "PASS", "trtllm_mla", "FAIL"), ("FAIL", "FAIL", "trtllm_mla", "FAIL"),
    ("INCONCLUSIVE", "PASS", "trtllm_mla", "FAIL"),
    ("PASS", "PASS", "flashinfer", "ok"), ("FAIL", "PASS", "flashinfer", "FAIL")])
def test_gate_verdicts(bad, cand, backend, status):
    out = c.gate_verdicts(_report(bad, cand), "fp8kv_badscale", "fp8kv_nvfp4shared_fp8drafter",
                          c.badscale_must_fail(backend))
    assert out.status == status, out.detail
    assert c.gate_verdicts({}, "fp8kv_badscale", "x", True).failed  # no report (a crashed gate) is no pass


def test_bubblewrap():
    assert c.bwrap_ready("bwrap", "").status == "ok"
    out = c.bwrap_ready("weak", "bwrap probe failed: setting up uid map: Permission denied")
    assert out.failed and "Permission denied" in out.detail


def test_spec_accept():
    assert c.spec_accept([2.4, 3.1, None]).status == "ok"
    assert c.spec_accept([1.0, 1.0]).failed  # every draft rejected
    assert c.spec_accept([None, None]).failed  # no meta_info: no speculation ran
    assert c.spec_accept([]).failed


def test_decode_numerics_reports_what_only_a_gpu_knows():
    tol = 0.01
    wide = c.decode_numerics([0.02], [0.02, 0.02], [0.01], [0.01, 0.01], tol)
    assert wide.status == "info" and "no rounding beyond" in wide.detail
    rounded = c.decode_numerics([0.02], [0.08, 0.09], [0.01], [0.01, 0.01], tol)
    assert rounded.status == "info" and "rounds beyond" in rounded.detail
    assert "not enough" in c.decode_numerics([], [], [], [], tol).detail


def test_server_numerics_picks_the_resolved_settings():
    info = {"attention_backend": "trtllm_mla", "kv_cache_dtype": "fp8_e4m3", "page_size": 64,
            "chunked_prefill_size": 16384, "tp_size": 4, "model_path": "/m", "internal_states": [{}]}
    got = c.server_numerics(info)
    assert got == {"attention_backend": "trtllm_mla", "kv_cache_dtype": "fp8_e4m3", "page_size": 64,
                   "chunked_prefill_size": 16384, "tp_size": 4}
    assert c.server_numerics({"server_args": {"page_size": 1}}) == {"page_size": 1}


def test_records_hold_what_the_rules_need():
    """The recorded lists are aligned and the FP8 effect, the badscale effect and the noise sit where the rules
    above assume (noise < FP8 effect < badscale effect)."""
    for row in REC.values():
        n = len(row["tokens"])
        assert all(len(row[k]) == n for k in ("noise", "bf16", "fp8", "fp8_plain", "badscale_k1", "badscale_k025"))
    mean = lambda xs: sum(xs) / len(xs)
    assert mean(_flat("noise")) < mean(_gaps("fp8", "fp8_plain")) < mean(_gaps("badscale_k025", "badscale_k1"))
    assert not math.isnan(c.tolerance(_flat("noise")))


def test_capacity_close():
    assert c.capacity_close(318_000, 308_000).status == "ok"
    assert c.capacity_close(250_000, 308_000).failed  # 19% below the plan
    assert c.capacity_close(None, 308_000).failed  # the server did not report it
