"""How a metric's numbers read, in one place so that report.md, report.html, the plots and the build facts
format them the same way (rates in % and percentage points, distances raw).

Below every other reports module: the tables (rows.py), the review (review.py) and the facts (facts.py) all
import it, and it imports none of them.
"""

from __future__ import annotations

from qverify.models import MetricResult


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
