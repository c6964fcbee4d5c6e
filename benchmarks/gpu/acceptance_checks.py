"""The GPU acceptance run's pass/fail rules (benchmarks/gpu/sglang_acceptance.py), as pure functions over what the run
records: no I/O, so each is unit-tested on recorded outputs (tests/benchmarks/test_acceptance_checks.py) and the
dry run prints them all (PLAN).

Per-token logprob gaps: SGLang's logprob of each token it generated (greedy, `/generate` with `return_logprob`)
against the embedded engine's for the same token, the engine fed the same prompt and SGLang's tokens (its prefill for
the first token, one absorbed decode step per later token, as SGLang computed them).

The tolerance, from the two numerics (stated, not yet checked against a GPU run):
- SGLang computes in bf16 (fp32 accumulation), the engine in fp32. The expected gap is bf16's rounding noise on this
  model and these tokens, measured on the host: the same build's HF forward in fp32 against bf16, teacher-forced on
  SGLang's tokens (`noise`). SGLang's fused kernels round less often than eager HF, so its own noise is at most about
  that; NOISE_FACTOR covers a different accumulation order.
- With an FP8 cache the two sides round latents that differ by that noise: a latent value within bf16's unit
  roundoff u = 2^-8 of an e4m3 rounding boundary (spaced 2^-3 apart, relative) rounds the other way, a share
  2u / 2^-3 = 1/16 of values, each a one-step change like the rounding itself; in quadrature sqrt(1/16) = 1/4 of the
  FP8 effect (`fp8_effect`: the engine's own gap between its FP8 path and the same build without FP8 KV).
tolerance = NOISE_FACTOR x mean(noise) + FLIP_SHARE x mean(fp8_effect) + FLOOR, on the mean gap over all tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NOISE_FACTOR = 3.0
FLIP_SHARE = 0.25
FLOOR = 1e-3  # nats: SGLang returns fp32 logprobs of bf16 logits; below this a mean gap says nothing
EMULATION_SHARE = 0.5  # the engine's FP8 emulation must remove at least half the gap that leaving FP8 out leaves
SCALE_READERS = ("trtllm_mla", "cutedsl_mla")  # backends whose decode multiplies logits by k_scale (docs/serve.md)
SEPARATION = 2.0  # the live k_scale: the best-fitting candidate's gap at most 1/2 of the next one's


@dataclass(frozen=True)
class Outcome:
    status: str  # "ok", "FAIL" or "info"
    detail: str

    @property
    def failed(self) -> bool:
        return self.status == "FAIL"


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _ok(ok: bool, detail: str) -> Outcome:
    return Outcome("ok" if ok else "FAIL", detail)


def gaps(a: list[float], b: list[float]) -> list[float]:
    """|a_t - b_t| over the tokens both have (per-token logprobs of the same tokens)."""
    return [abs(x - y) for x, y in zip(a, b)]


def tolerance(noise: list[float], fp8_effect: list[float] | None = None) -> float:
    """The mean per-token gap the engine may show against SGLang (module docstring)."""
    return NOISE_FACTOR * _mean(noise) + (FLIP_SHARE * _mean(fp8_effect) if fp8_effect else 0.0) + FLOOR


def engine_agrees(token_gaps: list[float], tol: float) -> Outcome:
    """The engine computes what SGLang served: mean gap within the tolerance."""
    if not token_gaps:
        return Outcome("FAIL", "no tokens compared")
    s = sorted(token_gaps)
    m = _mean(token_gaps)
    return _ok(m <= tol, f"mean |Δ logprob| {m:.5f} vs tolerance {tol:.5f} nats over {len(s)} tokens "
                         f"(p95 {s[int(0.95 * (len(s) - 1))]:.4f}, max {s[-1]:.4f})")


def fp8_emulation_needed(emulated: list[float], plain: list[float], tol: float) -> Outcome:
    """The comparison can tell: without its FP8 emulation the engine must sit at least twice as far from SGLang's
    FP8 server (else a wrong FP8 path would pass unseen). Where the engine without FP8 still passes engine_agrees
    (random-weight fixtures attend almost uniformly, so FP8 moves them little), this model cannot tell: reported."""
    a, b = _mean(emulated), _mean(plain)
    detail = f"mean gap with the engine's FP8 emulation {a:.5f}, without {b:.5f} (must be <= {EMULATION_SHARE} x)"
    if not b > tol:
        return Outcome("info", f"FP8 moves this model too little to tell ({b:.5f} <= tolerance {tol:.5f}); {detail}")
    return _ok(bool(a <= EMULATION_SHARE * b), detail)


def live_k_scale(gaps_by_scale: dict[float, list[float]], declared: float, backend: str, tol: float) -> Outcome:
    """The k_scale the live server applies, read from its outputs: the engine run with each candidate scale; the one
    it matches is the server's. No 0.5.23 endpoint exposes `k_scale_float` (`/get_weights_by_name` needs a model's
    `get_weights_by_name`, which DeepseekV2 lacks), so the server's own logprobs are the read-out.
    On a backend that reads the scale, the best fit must be `declared`, within the tolerance, and clearly apart; on
    one that ignores it (flashinfer, fa3) every candidate must fit alike: the scale has no effect there."""
    means = {s: _mean(g) for s, g in gaps_by_scale.items()}
    order = sorted(means, key=means.get)
    shown = ", ".join(f"k={s:g}: {means[s]:.5f}" for s in order)
    if backend not in SCALE_READERS:
        return _ok(all(v <= tol for v in means.values()), f"{backend} ignores k_scale; every candidate fits ({shown}; "
                                                           f"tolerance {tol:.5f})")
    best = order[0]
    apart = len(order) < 2 or means[order[1]] >= SEPARATION * means[best]
    return _ok(best == declared and means[best] <= tol and apart,
               f"live k_scale {best:g} (declared {declared:g}) on {backend}: {shown}; tolerance {tol:.5f}")


def badscale_must_fail(backend: str) -> bool:
    """fp8kv_badscale is wrong where the backend multiplies decode logits by its k_scale (0.25); elsewhere SGLang
    serves it exactly as fp8kv, and the gate must not FAIL it either."""
    return backend in SCALE_READERS


def gate_verdicts(report: dict, badscale_recipe: str, candidate_recipe: str, badscale_fails: bool) -> Outcome:
    """From `qverify gate --json`'s GateReport: the candidate not FAIL; badscale FAIL where its scale is read."""
    by = {c["recipe"]: c["verdict"] for c in report.get("candidates", [])}
    bad, cand = by.get(badscale_recipe), by.get(candidate_recipe)
    want = "FAIL" if badscale_fails else "not FAIL"
    ok = cand not in (None, "FAIL") and (bad == "FAIL" if badscale_fails else bad not in (None, "FAIL"))
    return _ok(ok, f"{candidate_recipe} {cand} (must not FAIL); {badscale_recipe} {bad} (must {want})")


def bwrap_ready(kind: str, reason: str) -> Outcome:
    """The coding suite's sandbox works here (qverify.suites.sandbox.sandbox_kind), checked before anything starts."""
    return _ok(kind == "bwrap", "bubblewrap sandbox works" if kind == "bwrap" else
               f"bubblewrap unavailable ({reason}): `apt-get install -y bubblewrap`, or allow user namespaces in the "
               "container (--security-opt seccomp=unconfined / kernel.unprivileged_userns_clone=1)")


def spec_accept(accept_lengths: list[float | None]) -> Outcome:
    """The FP8 drafter drafts: SGLang's per-request spec_accept_length present and above 1 on average."""
    got = [a for a in accept_lengths if a is not None]
    m = _mean(got)
    return _ok(bool(got) and m > 1.0, f"mean spec_accept_length {m:.2f} over {len(got)} of {len(accept_lengths)} requests")


def decode_numerics(fp8_first: list[float], fp8_decode: list[float], bf16_first: list[float],
                    bf16_decode: list[float], tol: float) -> Outcome:
    """What CPU code cannot know, reported (not gated): does the FP8 MLA decode kernel round beyond the engine's model
    of it (the cast latent and query, P and the accumulation kept wide)? A kernel that also rounds its softmax
    probabilities P to FP8 before P·V (as FP8 attention kernels may) adds a gap on decode tokens only: the first
    token comes from the prefill kernel. The excess of FP8 over bf16 KV, decode minus first token, says which."""
    first = _mean(fp8_first) - _mean(bf16_first)
    decode = _mean(fp8_decode) - _mean(bf16_decode)
    if math.isnan(first) or math.isnan(decode):
        return Outcome("info", "not enough tokens to tell")
    rounds = decode - max(first, 0.0) > tol
    verdict = ("the decode kernel rounds beyond the engine's model (softmax probabilities to FP8, likely): its FP8 "
               "gap exceeds the prefill's by more than the tolerance" if rounds else
               "no rounding beyond the engine's model is visible in decode (softmax probabilities kept wide, or their "
               "rounding below the tolerance)")
    return Outcome("info", f"{verdict}; FP8-over-bf16 gap excess: first token {first:+.5f}, decode {decode:+.5f} "
                           f"nats (tolerance {tol:.5f})")


CAPACITY_TOLERANCE = 0.10  # docs/capacity.md, "Limits of the estimate"


def capacity_close(served: int | None, planned: int) -> Outcome:
    """The KV tokens SGLang allocated (/server_info max_total_num_tokens) within 10% of `qverify capacity`'s plan."""
    ok = served is not None and abs(served - planned) <= CAPACITY_TOLERANCE * planned
    return _ok(ok, f"served {served}, planned {planned:,} (tolerance {CAPACITY_TOLERANCE:.0%})")


def server_numerics(info: dict) -> dict:
    """The numerics-relevant settings a live SGLang server resolved (/server_info; older servers nest server_args)."""
    flat = {**(info.get("server_args") or {}), **info}
    keys = ("attention_backend", "decode_attention_backend", "prefill_attention_backend", "kv_cache_dtype",
            "page_size", "chunked_prefill_size", "disable_radix_cache", "enable_deterministic_inference",
            "speculative_algorithm", "speculative_draft_model_quantization", "quantization", "dtype", "tp_size")
    return {k: flat.get(k) for k in keys if k in flat}


PLAN = (
    ("bubblewrap works (before anything starts)", "qverify's sandbox probe runs `print('ok')` under bwrap"),
    ("SGLang parses every launch command", "prepare_server_args + SpeculativeAlgorithm.from_string on each argv"),
    ("engine vs SGLang, qverify-tiny bf16 (bf16 KV)", "engine_agrees: mean |Δ logprob| <= tolerance(noise)"),
    ("engine vs SGLang, qverify-tiny fp8kv (fp8_e4m3 KV)", "engine_agrees: <= tolerance(noise, fp8_effect)"),
    ("engine vs SGLang, kimi_k25 fixture as_shipped (bf16 KV)", "engine_agrees, Kimi's attention shapes"),
    ("engine vs SGLang, kimi_k25 fixture fp8kv (fp8_e4m3 KV)", "engine_agrees, on the production MLA kernel"),
    ("the comparison can tell FP8 from bf16 KV", "fp8_emulation_needed: engine without FP8 >= 2x as far"),
    ("live k_scale of fp8kv is 1.0", "live_k_scale: the engine at k=1 fits the server, k=0.25 does not"),
    ("live k_scale of fp8kv_badscale is 0.25", "live_k_scale (where the backend reads it; else: has no effect)"),
    ("FP8 drafter drafts", "spec_accept: candidate with its FP8 drafter, mean spec_accept_length > 1"),
    ("gate: badscale must FAIL, the candidate must not FAIL", "gate_verdicts on `qverify gate --json`"),
    ("KV capacity of the kimi fixture's fp8kv server", "capacity_close: max_total_num_tokens within 10% of the plan"),
    ("numerics CPU code cannot know", "decode_numerics (softmax P rounded to FP8?) and server_numerics: reported"),
)
