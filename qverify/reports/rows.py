"""The release review's tables, as rows of formatted cells, and the formatters behind them.

One module for both so that report.md, report.html and the plots format a metric the same way
(rates in % and percentage points, distances raw).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qverify.models import MetricResult

if TYPE_CHECKING:  # annotations only: review.py imports the formatters from here
    from qverify.reports.review import Review


def is_rate(m: MetricResult) -> bool:
    """Accuracy-like metrics read as percentages; distances (kld) stay raw."""
    return "kld" not in m.metric and all(0.0 <= v <= 1.0 for v in (m.baseline_mean, m.candidate_mean))


def fmt_value(m: MetricResult, v: float | None) -> str:
    if v is None:
        return "–"
    return f"{100 * v:.1f}%" if is_rate(m) else f"{v:.4g}"


def fmt_delta(m: MetricResult, v: float, signed: bool = True, unit: bool = True) -> str:
    s = f"{100 * v:+.1f}" if is_rate(m) else f"{v:+.3g}" if unit else f"{v:+.2g}"
    s = s if signed else s.lstrip("+")
    return s.replace("-", "−") + (" pts" if is_rate(m) and unit else "")


def fmt_spread(m: MetricResult, spread: list[float]) -> str:
    if len(spread) < 2:
        return ""
    lo, hi = min(spread), max(spread)
    return f"{100 * lo:.1f}–{100 * hi:.1f}" if is_rate(m) else f"{lo:.3g}–{hi:.3g}"


def fmt_p(m: MetricResult) -> str:
    if m.p_value is None:
        return "–"
    f = lambda p: f"{p:.2g}" if p >= 0.001 else "<0.001"
    return f(m.p_value) + (f" / {f(m.p_adjusted)}" if m.p_adjusted is not None else "")


_FLIP_SYMBOL = {"regressed": "↓", "improved": "↑"}


def fmt_flips(m: MetricResult) -> str:
    """regressed/improved as ↓n ↑n, then the flip rate against the baseline's own replicate-to-replicate rate."""
    f = m.flips
    parts = [f"{sym}{f[k]:g}" for k, sym in _FLIP_SYMBOL.items() if k in f]
    if "rate" in f:
        parts.append(f"({f['rate']:.0%}" + (f" vs {f['baseline_rate']:.0%} base)" if "baseline_rate" in f else ")"))
    parts += [f"{k}={v:.3g}" for k, v in f.items() if k not in (*_FLIP_SYMBOL, "rate", "baseline_rate")]
    return " ".join(parts) or "–"


def fmt_bytes(n: float | None) -> str:
    if not n:
        return "–"
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:,.2f} {unit}"
    return f"{int(n)} B"


def fmt_tokens(n: float | None) -> str:
    if n is None:
        return "–"
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.0f}k" if n >= 1e4 else f"{n:,.0f}"


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
            [f.recipe, fmt_bytes(p["weights_bytes"]), fmt_bytes(p["weights_bytes"] / p["tp"]),
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
