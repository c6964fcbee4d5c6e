"""Realistic synthetic gate folders for the report tests: builds, replicated runs and a GateReport.

The numbers follow the shapes the real pipeline produces (the embedded qverify-tiny model:
3 layers of MLA, kv_lora 512 + rope 64; 3 replicates; coding/toolcall/longctx/kld suites),
with item-level outcomes drawn from per-item difficulties so flips, spreads and CIs are
real statistics over real ItemResults. Secrets are planted where a careless reporter would
leak them (serving flags, launch command, server log, endpoint URL, gate config).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from qverify.evals.store import RunStore
from qverify.models import (
    BuildManifest,
    CandidateReport,
    GateReport,
    ItemResult,
    MetricResult,
    Response,
    RunManifest,
    Sampling,
    SchemeSummary,
    ServingProfile,
    ToolCall,
)

SECRETS = {
    "flag": "sk-live-4f9c2a7b1e8d3f6a0c5b9e2d",
    "command": "sk-cmd-7d1e0b6a4c3f2e9d8a7b6c5d",
    "hf": "hf_QvErIfYfAkEtOkEn1234567890abcd",
    "bearer": "bearerSecretZ9y8x7w6v5u4t3",
    "env": "envLeak-Q1w2E3r4T5y6U7i8",  # set as QVERIFY_FAKE_API_TOKEN by the tests; appears unnamed in a log
    "url": "urlPassw0rdXyZ123",
    "config": "gatePassw0rd-aa11bb22",
}
ENV_SECRET_NAME = "QVERIFY_FAKE_API_TOKEN"
LENGTHS = (128, 256, 512, 1024)
SUITES = {"coding": 24, "toolcall": 24, "longctx": 32, "kld": 16}
KV_BF16 = 3 * (512 + 64) * 2


@dataclass
class Cand:
    recipe: str
    effect: float  # probability shift applied to each item's success chance (negative = damage)
    kv_dtype: str = "bf16"
    weights_scale: float = 1.0
    accept_length: float = 2.6
    control: bool = False
    schemes: list[SchemeSummary] = field(default_factory=list)


RECIPES = {
    "bf16": Cand("bf16", 0.0),
    "fp8kv_nvfp4shared": Cand("fp8kv_nvfp4shared", 0.0, "fp8_e4m3", 0.93, 2.58, schemes=[
        SchemeSummary(scheme="NVFP4", targets=["re:.*shared_experts.*"], modules=9, params=294912, format="nvfp4-pack-quantized"),
        SchemeSummary(scheme="kv_cache:fp8", targets=["re:.*self_attn$"])]),
    "fp8kv": Cand("fp8kv", 0.0, "fp8_e4m3", 1.0, 2.6, schemes=[SchemeSummary(scheme="kv_cache:fp8", targets=["re:.*self_attn$"])]),
    "nvfp4_all": Cand("nvfp4_all", -0.45, "bf16", 0.31, 1.7, control=True, schemes=[
        SchemeSummary(scheme="NVFP4", targets=["Linear"], modules=42, params=1_900_000, format="nvfp4-pack-quantized")]),
}


def build_id(recipe: str, model: str = "qverify-tiny") -> str:
    return hashlib.sha256(f"{model}|{recipe}".encode()).hexdigest()[:16]


def write_build(workdir: Path, c: Cand, model: str = "qverify-tiny") -> BuildManifest:
    bid = build_id(c.recipe, model)
    total = int(4_081_664 * c.weights_scale)
    m = BuildManifest(
        build_id=bid, recipe=c.recipe, recipe_hash=hashlib.md5(c.recipe.encode()).hexdigest(),
        recipe_text=f"# {c.recipe}\nquant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      ignore: [lm_head]\n",
        source_model=f"qverify/assets/{model}", source_hash="5ca1ab1e" * 2, calibration={"samples": 64, "seq_len": 256},
        versions={"llmcompressor": "0.14.0.1", "torch": "2.13.0"}, quantization=c.schemes,
        serving={"kv_cache_dtype": c.kv_dtype} if c.kv_dtype != "bf16" else {}, bytes_by_dtype={"bf16": total},
        total_bytes=total, kv_dtype=c.kv_dtype, kv_bytes_per_token=KV_BF16 // (2 if "fp8" in c.kv_dtype else 1), control=c.control,
    )
    d = workdir / "builds" / bid
    d.mkdir(parents=True, exist_ok=True)
    (d / "build.json").write_text(m.model_dump_json(indent=2))
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / f"serve-{bid}.log").write_text(
        f"[INFO] launching sglang for {c.recipe}\n[DEBUG] env HF_TOKEN={SECRETS['hf']}\n"
        f"[DEBUG] upstream Authorization: Bearer {SECRETS['bearer']}\n[DEBUG] probe used {SECRETS['env']}\n"
        f"[INFO] max_total_num_tokens=182000 avg_spec_accept_length={c.accept_length}\n[INFO] ready\n")
    return m


def _response(suite: str, item: int, ok: bool) -> Response:
    if suite == "toolcall":
        args = json.dumps({"path": f"src/mod_{item}.py", "line": item * 3 + (0 if ok else 1)})
        return Response(tool_calls=[ToolCall(id=f"c{item}", name="read_file" if ok else "open_file", arguments=args)], finish_reason="tool_calls")
    if suite == "longctx":
        return Response(content=f"KEY_{item} = {40000 + item * 7 if ok else 40000 + item * 7 + 13}", finish_reason="stop")
    if suite == "coding":
        body = "return a + b" if ok else "return a - b"
        return Response(content=f"def solve_{item}(a, b):\n    {body}\n", finish_reason="stop")
    return Response(content="", finish_reason="length")


def _metric_keys(suite: str, item: int) -> dict[str, str]:
    return {"coding": {"pass@1": ""}, "toolcall": {"exact_call": "", "trigger": ""},
            "longctx": {"accuracy": "", f"accuracy@{LENGTHS[item % len(LENGTHS)]}": ""}, "kld": {"kld": ""}}[suite]


def write_runs(workdir: Path, c: Cand, reps: int, seed: int, model: str = "qverify-tiny") -> None:
    bid = build_id(c.recipe, model)
    for suite, n in SUITES.items():
        store = RunStore(workdir / "runs" / bid / suite)
        for k in range(reps):
            rng = random.Random(f"{suite}|{c.recipe}|{k}|{seed}")
            with store.writer(k) as w:
                for i in range(n):
                    p = random.Random(f"{suite}|{i}").uniform(0.35, 0.98)  # item difficulty, shared by every build
                    ok = rng.random() < max(0.0, min(1.0, p + c.effect))
                    if suite == "kld":
                        kl = abs(rng.gauss(0.003 - c.effect * 0.2, 0.001))  # bf16: replicate-vs-replicate KL
                        scores = {"kld": kl}
                    else:
                        scores = {m: float(ok) for m in _metric_keys(suite, i)}
                        if suite == "toolcall":
                            scores["trigger"] = 1.0
                    w.append(ItemResult(
                        item_id=f"{suite}-{hashlib.md5(f'{suite}{i}'.encode()).hexdigest()[:12]}", suite=suite, replicate=k,
                        seed=1000 * k + i, request_hash=f"rq{i}", response=_response(suite, i, ok), scores=scores,
                        reason=None if ok or suite == "kld" else "wrong answer", latency_s=0.05 + 0.01 * rng.random(),
                        ttft_s=0.02, accept_length=c.accept_length, metadata={"length": LENGTHS[i % len(LENGTHS)]} if suite == "longctx" else {},
                    ))
        flags = {"kv-cache-dtype": c.kv_dtype if c.kv_dtype != "bf16" else "auto", "speculative-algorithm": "EAGLE", "api-key": SECRETS["flag"]}
        store.write_manifest(RunManifest(
            build_id=bid, suite=suite, suite_version="1", item_set_hash=f"items-{suite}", n_items=n, replicates=reps,
            sampling=Sampling(temperature=0.6, max_tokens=64),
            serving=ServingProfile(name="sglang-h200-tp1", backend="sglang", tp=1, flags=flags,
                                   endpoint=f"https://qverify:{SECRETS['url']}@serve.internal/v1"),
            server_command=["python", "-m", "sglang.launch_server", "--model-path", f"/builds/{bid}", "--tp", "1",
                            "--kv-cache-dtype", flags["kv-cache-dtype"], "--api-key", SECRETS["command"]],
            complete=True, perf={"ttft_s": 0.021 / c.weights_scale ** 0.1, "decode_tok_s": 400.0 * (1.0 + (1 - c.weights_scale) * 0.3),
                                 "accept_length": c.accept_length},
        ))


def _item_means(workdir: Path, bid: str, suite: str, metric: str) -> tuple[dict[str, float], list[float]]:
    store = RunStore(workdir / "runs" / bid / suite)
    per_item: dict[str, list[float]] = {}
    reps = []
    for rs in store.all_results().values():
        vals = [r.scores[metric] for r in rs if metric in r.scores]
        reps.append(sum(vals) / len(vals))
        for r in rs:
            if metric in r.scores:
                per_item.setdefault(r.item_id, []).append(r.scores[metric])
    return {i: sum(v) / len(v) for i, v in per_item.items()}, reps


def metric_result(workdir: Path, base: str, cand: str, suite: str, metric: str) -> MetricResult:
    """Paired Δ with a normal CI and a noise band from the baseline's replicate spread (enough for fixtures)."""
    direction = "lower" if metric == "kld" else "higher"
    b_items, b_reps = _item_means(workdir, base, suite, metric)
    c_items, c_reps = _item_means(workdir, cand, suite, metric)
    common = sorted(set(b_items) & set(c_items))
    d = [c_items[i] - b_items[i] for i in common]
    delta = sum(d) / len(d)
    se = (statistics.stdev(d) / math.sqrt(len(d))) if len(d) > 1 else 0.0
    band = 1.96 * statistics.stdev(b_reps) * math.sqrt(2) if len(b_reps) > 1 else 0.0
    tol = 0.02 if direction == "higher" else 0.01
    o = delta if direction == "higher" else -delta
    lo, hi = o - 1.96 * se, o + 1.96 * se
    verdict = "FAIL" if hi < -(band + tol) else "PASS" if lo >= -(band + tol) else "INCONCLUSIVE"
    p = math.erfc(abs(delta) / (se * math.sqrt(2))) if se > 0 else 1.0
    ci = (delta - 1.96 * se, delta + 1.96 * se)
    b_ok = {i for i in common if b_items[i] == 1.0}
    c_bad = {i for i in common if c_items[i] == 0.0}
    return MetricResult(
        metric=f"{suite}/{metric}", direction=direction, gated=not metric.startswith("accuracy@"),
        baseline_mean=sum(b_reps) / len(b_reps), candidate_mean=sum(c_reps) / len(c_reps), baseline_spread=b_reps,
        candidate_spread=c_reps, delta=delta, ci_low=ci[0], ci_high=ci[1], noise_band=band, tolerance=tol, mde=2.8 * se,
        p_value=p, p_adjusted=min(1.0, p * 4), flips={"regressed": len(b_ok & c_bad), "improved": len({i for i in common if b_items[i] == 0.0 and c_items[i] == 1.0})},
        n_items=len(common), verdict=verdict,
        reason={"PASS": "Δ within the noise band", "FAIL": "whole CI below −(noise band + tolerance)",
                "INCONCLUSIVE": "CI overlaps the fail line"}[verdict],
    )


def make_gate(workdir: Path, gate_id: str, candidates: list[str], reps: int = 3, seed: int = 0,
              model: str = "qverify-tiny") -> GateReport:
    """Write builds, runs and gates/<gate_id>/gate.json under `workdir`; returns the GateReport."""
    workdir.mkdir(parents=True, exist_ok=True)
    base = build_id("bf16", model)
    for r in ["bf16", *candidates]:
        if not (workdir / "builds" / build_id(r, model) / "build.json").exists():
            write_build(workdir, RECIPES[r], model)
            write_runs(workdir, RECIPES[r], reps, seed, model)
    reports = []
    for r in candidates:
        cid = build_id(r, model)
        ms = [metric_result(workdir, base, cid, s, m) for s, keys in
              {"coding": ["pass@1"], "toolcall": ["exact_call", "trigger"], "longctx": ["accuracy"] + [f"accuracy@{L}" for L in LENGTHS],
               "kld": ["kld"]}.items() for m in keys]
        gated = [m for m in ms if m.gated]
        v = next((x for x in ("FAIL", "INCONCLUSIVE") if any(m.verdict == x for m in gated)), "PASS")
        reasons = [f"{m.metric}: {m.reason}" for m in gated if m.verdict == v and v != "PASS"]
        reports.append(CandidateReport(build_id=cid, recipe=r, verdict=v, reasons=reasons, metrics=ms,
                                       perf={"accept_length": RECIPES[r].accept_length}))
    verdict = next((x for x in ("FAIL", "INCONCLUSIVE") if any(c.verdict == x for c in reports)), "PASS")
    gate = GateReport(gate_id=gate_id, baseline=base, baseline_recipe="bf16", verdict=verdict, candidates=reports,
                      config={"replicates": reps, "alpha": 0.05, "suites": list(SUITES), "tracker_password": SECRETS["config"]})
    d = workdir / "gates" / gate_id
    d.mkdir(parents=True, exist_ok=True)
    (d / "gate.json").write_text(gate.model_dump_json(indent=2))
    return gate
