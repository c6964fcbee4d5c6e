"""The review's figures (matplotlib, Agg): each function writes one PNG and returns its path, or None without data."""

from __future__ import annotations

import math
import re
from pathlib import Path

from qverify.models import MetricResult
from qverify.reports.bundle import GateBundle, metric_name, suite_of
from qverify.reports.facts import BuildFacts
from qverify.reports.formatting import is_rate

VERDICT_COLOR = {"PASS": "#1a7f37", "FAIL": "#cf222e", "INCONCLUSIVE": "#bf8700"}
BASE_COLOR = "#57606a"
_LEN = re.compile(r"^longctx/accuracy@(\d+)$")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False, "figure.dpi": 110})
    return plt


def build_colors(bundle: GateBundle) -> dict[str, str]:
    palette = ["#0969da", "#8250df", "#bc4c00", "#1b7c83", "#bf3989", "#4d2d00"]
    out = {bundle.gate.baseline: BASE_COLOR}
    for i, c in enumerate(bundle.gate.candidates):
        out[c.build_id] = palette[i % len(palette)]
    return out


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def forest(bundle: GateBundle, out: Path) -> Path | None:
    """One panel per metric: Δ and its one-sided bounds per candidate, ±1 run-to-run SD shaded, the tolerance dashed."""
    metrics: list[str] = []
    for c in bundle.gate.candidates:
        metrics += [m.metric for m in c.metrics if m.metric not in metrics]
    if not metrics:
        return None
    plt = _plt()
    cands = bundle.gate.candidates
    ncols = min(3, len(metrics))
    nrows = math.ceil(len(metrics) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, (0.45 * len(cands) + 1.1) * nrows), squeeze=False)
    for ax, name in zip(axes.flat, metrics):
        rows: list[tuple[int, MetricResult]] = [(i, m) for i, c in enumerate(cands) for m in c.metrics if m.metric == name]
        ref = rows[0][1]
        k = 100.0 if is_rate(ref) else 1.0  # percentage points, as in the tables
        band, tol = ref.noise_band * k, ref.tolerance * k
        ax.axvspan(-band, band, color="#d0d7de", alpha=0.6, lw=0, label="run-to-run SD")
        sign = -1 if ref.direction == "higher" else 1
        # the margin: PASS when the whole bound is on the good side of it, FAIL when wholly past it
        ax.axvline(sign * tol, color="#cf222e", ls="--", lw=0.9, label="tolerance")
        ax.axvline(0, color="#57606a", lw=0.6)
        for i, m in rows:
            col = VERDICT_COLOR[m.verdict]
            # a bound clipped at the metric's range (Δ +1.000 [+0.326, +1.000]) can sit a rounding error inside Δ:
            # matplotlib refuses a negative error bar, which cost a FAIL gate its release review
            lo, hi = max(m.delta - m.ci_low, 0.0), max(m.ci_high - m.delta, 0.0)
            ax.errorbar(m.delta * k, i, xerr=[[lo * k], [hi * k]], fmt="o", color=col,
                        ms=5, capsize=3, lw=1.4)
        ax.set_yticks(range(len(cands)), [c.recipe for c in cands])
        ax.set_ylim(-0.6, len(cands) - 0.4)
        ax.invert_yaxis()
        lim = max(abs(v) for _, m in rows for v in (m.ci_low * k, m.ci_high * k, band, tol)) * 1.15 or 1.0
        ax.set_xlim(-lim, lim)
        gated = "" if ref.gated else " (inform only)"
        ax.set_title(f"{name}{gated}  ({'↑' if ref.direction == 'higher' else '↓'} better)", fontsize=9)
        ax.set_xlabel("Δ candidate − baseline" + (" (pts)" if k == 100.0 else ""), fontsize=8)
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, frameon=False, bbox_to_anchor=(0.5, -0.02))
    fig.suptitle("Quality change per metric: Δ with its one-sided bounds against the tolerance", fontsize=11)
    return _save(fig, out / "forest.png")


def longctx(bundle: GateBundle, out: Path) -> Path | None:
    """Accuracy by context length, baseline against each candidate, with the replicate range."""
    cands = bundle.gate.candidates
    series = {c.build_id: sorted((int(_LEN.match(m.metric)[1]), m) for m in c.metrics if _LEN.match(m.metric)) for c in cands}
    if not any(series.values()):
        return None
    plt = _plt()
    colors = build_colors(bundle)
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    first = next(s for s in series.values() if s)
    xs = [L for L, _ in first]
    ax.plot(xs, [m.baseline_mean for _, m in first], "o-", color=BASE_COLOR, lw=2, label=f"{bundle.gate.baseline_recipe} (baseline)")
    ax.fill_between(xs, [min(m.baseline_spread or [m.baseline_mean]) for _, m in first],
                    [max(m.baseline_spread or [m.baseline_mean]) for _, m in first], color=BASE_COLOR, alpha=0.15, lw=0)
    for c in cands:
        s = series[c.build_id]
        if not s:
            continue
        lo = [m.candidate_mean - min(m.candidate_spread or [m.candidate_mean]) for _, m in s]
        hi = [max(m.candidate_spread or [m.candidate_mean]) - m.candidate_mean for _, m in s]
        ax.errorbar([L for L, _ in s], [m.candidate_mean for _, m in s], yerr=[lo, hi], fmt="s--", capsize=3,
                    color=colors[c.build_id], label=f"{c.recipe} ({c.verdict})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("accuracy")
    ax.set_title("Long-context accuracy by context length (band/bars: replicate range)")
    ax.legend(frameon=False, fontsize=8)
    return _save(fig, out / "longctx.png")


def replicate_scatter(bundle: GateBundle, out: Path) -> Path | None:
    """Per suite, each replicate's mean per build: how far apart re-runs land, next to the candidates."""
    panels: list[tuple[str, MetricResult]] = []
    for s in bundle.suites:
        ms = [m for c in bundle.gate.candidates for m in c.metrics if suite_of(m) == s and m.baseline_spread]
        if ms:
            panels.append((s, next((m for m in ms if m.gated), ms[0])))
    if not panels:
        return None
    plt = _plt()
    colors = build_colors(bundle)
    fig, axes = plt.subplots(1, len(panels), figsize=(2.6 * len(panels) + 0.8, 3.0), squeeze=False)
    for ax, (suite, ref) in zip(axes.flat, panels):
        ids = bundle.build_ids
        for x, b in enumerate(ids):
            if b == bundle.gate.baseline:
                ys = ref.baseline_spread
            else:
                m = next((m for m in bundle.candidate(b).metrics if m.metric == ref.metric), None)
                ys = m.candidate_spread if m else []
            jitter = [x + (j - (len(ys) - 1) / 2) * 0.06 for j in range(len(ys))]
            ax.scatter(jitter, ys, s=22, color=colors[b], zorder=3)
            if ys:
                ax.hlines(sum(ys) / len(ys), x - 0.25, x + 0.25, color=colors[b], lw=1.5)
        ax.set_xticks(range(len(ids)), [bundle.recipe(b) for b in ids], rotation=25, ha="right", fontsize=7)
        ax.set_title(f"{suite}: {metric_name(ref)}", fontsize=9)
        ax.set_xlim(-0.6, len(ids) - 0.4)
    fig.suptitle("Replicate means per build (one dot per replicate, line = mean)", fontsize=10)
    return _save(fig, out / "replicates.png")


def capacity(bundle: GateBundle, facts: list[BuildFacts], out: Path) -> Path | None:
    """Weights size and KV cache capacity (tokens per GiB of cache) per build."""
    if not any(f.weights_bytes or f.kv_bytes_per_token for f in facts):
        return None
    plt = _plt()
    colors = build_colors(bundle)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8.4, 3.0))
    labels = [f.recipe for f in facts]
    cols = [colors[f.build_id] for f in facts]
    w = [(f.weights_bytes or 0) / 1e6 for f in facts]
    bars = a1.bar(labels, w, color=cols)
    a1.bar_label(bars, [f"{v:,.2f}" for v in w], fontsize=7)
    a1.set_ylabel("weights (MB)")
    a1.set_title("Weights size per build")
    kv = [(f.kv_tokens_per_gib or 0) / 1e3 for f in facts]
    bars = a2.bar(labels, kv, color=cols)
    a2.bar_label(bars, [f"{v:,.1f}k" + (f"  ×{f.kv_tokens_ratio:.2f}" if f.kv_tokens_ratio and f.kv_tokens_ratio != 1 else "")
                        for v, f in zip(kv, facts)], fontsize=7)
    a2.set_ylabel("KV tokens per GiB (thousands)")
    a2.set_title("KV cache capacity per build")
    for a in (a1, a2):
        a.tick_params(axis="x", labelrotation=20, labelsize=7)
    return _save(fig, out / "capacity.png")


def accept_length(bundle: GateBundle, facts: list[BuildFacts], out: Path) -> Path | None:
    """Speculative-decoding accept length per build (a drafter change shows up here)."""
    have = [f for f in facts if f.accept_length is not None]
    if not have:
        return None
    plt = _plt()
    colors = build_colors(bundle)
    fig, ax = plt.subplots(figsize=(4.8, 2.8))
    bars = ax.bar([f.recipe for f in have], [f.accept_length for f in have], color=[colors[f.build_id] for f in have])
    ax.bar_label(bars, [f"{f.accept_length:.2f}" for f in have], fontsize=8)
    ax.set_ylabel("mean accept length (tokens)")
    ax.set_title("Speculative accept length per build")
    ax.tick_params(axis="x", labelrotation=20, labelsize=7)
    return _save(fig, out / "accept_length.png")


def all_plots(bundle: GateBundle, facts: list[BuildFacts], out: Path) -> dict[str, Path]:
    made = {
        "forest": forest(bundle, out), "longctx": longctx(bundle, out), "replicates": replicate_scatter(bundle, out),
        "capacity": capacity(bundle, facts, out), "accept_length": accept_length(bundle, facts, out),
    }
    return {k: v for k, v in made.items() if v is not None}
