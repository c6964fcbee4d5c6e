"""The release review's tables, as rows of formatted cells (the formatters: qverify.reports.formatting)."""

from __future__ import annotations

from qverify.reports.formatting import fmt_bytes, fmt_delta, fmt_flips, fmt_p, fmt_spread, fmt_tokens, fmt_value
from qverify.reports.review import Review

METRIC_COLUMNS = ["metric", "baseline", "candidate", "Δ", "one-sided bounds", "run SD", "tol", "MDE", "p / adj", "flips ↓↑", "verdict", "why"]
PLOT_TITLES = {
    "forest": "Δ and its bounds against the tolerance, per metric", "longctx": "Long-context accuracy by length",
    "replicates": "Replicate spread per suite", "capacity": "Weights size and KV capacity", "accept_length": "Accept length",
}


def metric_rows(review: Review, build_id: str) -> list[dict[str, str]]:
    """Formatted cells per metric; rates in % and percentage points, distances raw."""
    rows = []
    for m in review.bundle.candidate(build_id).metrics:
        rows.append({
            "metric": m.metric, "gated": "" if m.gated else "inform only",
            "baseline": fmt_value(m, m.baseline_mean), "baseline_spread": fmt_spread(m, m.baseline_spread),
            "candidate": fmt_value(m, m.candidate_mean), "candidate_spread": fmt_spread(m, m.candidate_spread),
            "delta": fmt_delta(m, m.delta),
            "ci": f"[{fmt_delta(m, m.ci_low, unit=False)}, {fmt_delta(m, m.ci_high, unit=False)}]",
            "band": fmt_delta(m, m.noise_band, signed=False, unit=False),
            "tol": fmt_delta(m, m.tolerance, signed=False, unit=False), "mde": fmt_delta(m, m.mde, signed=False, unit=False),
            "p": fmt_p(m), "flips": fmt_flips(m), "verdict": m.verdict,
            "why": m.reason + (f" {m.advice}" if m.advice else ""),
        })
    return rows


CAPACITY_COLUMNS = ["build", "weights", "weights Δ", "KV dtype", "KV bytes/token", "KV tokens per GiB"]
PROJECTION_COLUMNS = ["build", "weights", "weights per GPU", "KV tokens per replica", "sessions"]


def capacity_rows(review: Review) -> list[list[str]]:
    return [[f"{f.recipe} ({f.build_id[:8]})", fmt_bytes(f.weights_bytes),
             f"{100 * f.weights_change:+.1f}%" if f.weights_change else "–", f.kv_dtype or "–",
             f"{f.kv_bytes_per_token:,}" if f.kv_bytes_per_token else "–",
             fmt_tokens(f.kv_tokens_per_gib) + (f" (×{f.kv_tokens_ratio:.2f})" if f.kv_tokens_ratio and f.kv_tokens_ratio != 1 else "")]
            for f in review.facts]


def projection(review: Review) -> tuple[str, list[list[str]]]:
    """The capacity planner's view of each recipe on the production model: a title and rows (empty without it)."""
    ps = [(f, f.projection) for f in review.facts if f.projection]
    p0 = next((p for _, p in ps if "error" not in p), None)
    if p0 is None:
        return "", []
    title = (f"{p0['model']} with the same recipes on {p0['tp']}× {p0['gpu'].upper()} "
             f"(qverify capacity; sessions at {p0['context']:,} tokens)")
    rows = [[f.recipe, "–", "–", f"not priced: {p['error']}", "–"] if "error" in p else
            [f.recipe, fmt_bytes(p["weights_bytes"]), fmt_bytes(p.get("weights_per_gpu_bytes") or p["weights_bytes"] / p["tp"]),
             fmt_tokens(p["kv_tokens_per_replica"]) + ("" if p["fits"] else " (does not fit)"), f"{p['sessions']:,}"]
            for f, p in ps]
    return title, rows


def perf_rows(review: Review) -> list[list[str]]:
    if not any(f.ttft_s or f.decode_tok_s or f.accept_length for f in review.facts):
        return []
    return [[f"{f.recipe} ({f.build_id[:8]})",
             f"{1000 * f.ttft_s:.1f} ms" if f.ttft_s is not None else "–",
             f"{f.decode_tok_s:,.1f}" if f.decode_tok_s is not None else "–",
             f"{f.accept_length:.2f}" if f.accept_length is not None else "–"] for f in review.facts]


PERF_COLUMNS = ["build", "TTFT", "decode tok/s", "accept length"]


def flips_title(review: Review, build_id: str) -> str:
    n = review.flip_counts[build_id]
    shown = len(review.flips[build_id])
    total = n["regressed"] + n["improved"]
    if not total:
        return f"{review.bundle.recipe(build_id)}: no item flipped"
    return (f"{review.bundle.recipe(build_id)}: {total} items flipped ({n['regressed']} regressed, {n['improved']} improved)"
            + (f", {shown} shown" if shown < total else ""))
