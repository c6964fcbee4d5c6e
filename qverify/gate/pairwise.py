"""Item-level comparisons between runs: flips, McNemar, K2VV trigger-F1 and its floor, KL matrices.

Pure functions over per-item replicate matrices (n items x K replicates, NaN = missing),
and, for KL, over the per-token logprob lists the runs stored.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy import stats as sps

from qverify.models import Response

# --------------------------------------------------------------------------- flips (Dutta et al. 2024)


def is_binary(*xs: np.ndarray) -> bool:
    return all(np.isin(x[~np.isnan(x)], (0.0, 1.0)).all() for x in xs)


def _all(x: np.ndarray, value: float) -> np.ndarray:
    has = (~np.isnan(x)).any(axis=1)
    filled = np.where(np.isnan(x), value, x)  # a missing replicate neither confirms nor breaks "every"
    return has & (filled == value).all(axis=1)


def flip_counts(b: np.ndarray, c: np.ndarray) -> tuple[int, int]:
    """(lost, gained): items right in every baseline replicate and wrong in every candidate one, and the reverse."""
    lost = int((_all(b, 1.0) & _all(c, 0.0)).sum())
    gained = int((_all(b, 0.0) & _all(c, 1.0)).sum())
    return lost, gained


def flip_direction(b: list[float], c: list[float]) -> Literal["regressed", "improved"] | None:
    """One item's flip, by flip_counts' rule (the one definition the release review's flips also use): its
    scores over the baseline's and the candidate's replicates."""
    lost, gained = flip_counts(np.array([b], float), np.array([c], float))
    return "regressed" if lost else "improved" if gained else None


def self_flip_rate(b: np.ndarray, max_splits: int = 20, seed: int = 0) -> float | None:
    """The baseline's own flip rate: (lost + gained) / n between halves of its replicates, averaged over splits.

    Halves of size floor(K/2) and the rest; "every replicate" is easier to satisfy with fewer
    replicates, so compare it with the candidate's rate knowing the group sizes differ.
    """
    n, k = b.shape
    if k < 2 or n == 0:
        return None
    splits = list(itertools.combinations(range(k), k // 2))
    if len(splits) > max_splits:
        rng = np.random.default_rng(seed)
        splits = [splits[i] for i in rng.choice(len(splits), max_splits, replace=False)]
    rates = []
    for half in splits:
        rest = [j for j in range(k) if j not in half]
        lost, gained = flip_counts(b[:, list(half)], b[:, rest])
        rates.append((lost + gained) / n)
    return float(np.mean(rates))


def flips(b: np.ndarray, c: np.ndarray) -> dict[str, float]:
    n = len(b)
    lost, gained = flip_counts(b, c)
    out = {"regressed": float(lost), "improved": float(gained), "rate": (lost + gained) / n if n else 0.0}
    base = self_flip_rate(b)
    if base is not None:
        out["baseline_rate"] = base
    return out


def mcnemar_p(lost: int, gained: int) -> float:
    """Exact McNemar: two-sided binomial test of lost vs gained discordant items (1.0 when none)."""
    if lost + gained == 0:
        return 1.0
    return float(sps.binomtest(lost, lost + gained, 0.5).pvalue)


# --------------------------------------------------------------------------- K2VV trigger-F1


def f1_score(tp: float | np.ndarray, fp: float | np.ndarray, fn: float | np.ndarray) -> float | np.ndarray:
    """F1 of the positive class (a tool call), elementwise: 2 tp / (2 tp + fp + fn).

    The one definition, for the gate's jackknife (qverify.gate.design) and the K2VV floor here. Undefined
    (NaN) when neither run calls a tool (tp + fp + fn = 0): two runs that never call agree on nothing F1 can
    measure, so it is not 1.0; the gate refuses trigger-F1 then (qverify.gate.assemble), and a floor over such a
    pair is None."""
    den = 2 * np.asarray(tp, float) + fp + fn
    out = np.divide(2 * np.asarray(tp, float), den, out=np.full(np.shape(den), np.nan), where=den > 0)
    return float(out) if np.ndim(out) == 0 else out


def trigger_counts(ref: np.ndarray, pred: np.ndarray) -> dict[str, int]:
    """K2VV counts of finish_reason == tool_calls, with `ref` as the reference run (1 = tool call)."""
    ok = ~np.isnan(ref) & ~np.isnan(pred)
    r, p = ref[ok] == 1, pred[ok] == 1
    return {"tp": int((r & p).sum()), "fp": int((~r & p).sum()), "fn": int((r & ~p).sum()), "tn": int((~r & ~p).sum())}


def trigger_f1(ref: np.ndarray, pred: np.ndarray) -> float:
    c = trigger_counts(ref, pred)
    return f1_score(c["tp"], c["fp"], c["fn"])


def f1_between(b: np.ndarray) -> list[float]:
    """F1 between every pair of baseline runs (F1 is symmetric in which run is the reference)."""
    return [trigger_f1(b[:, k], b[:, l]) for k, l in itertools.combinations(range(b.shape[1]), 2)]


def f1_floor(b: np.ndarray, margin: float) -> float | None:
    """K2VV's bar: the lowest F1 between baseline runs, minus a margin (75.81% -> 73% there); None without a
    pair, or when some pair's F1 is undefined (f1_score)."""
    pairs = f1_between(b)
    return min(pairs) - margin if pairs and not np.isnan(pairs).any() else None


# --------------------------------------------------------------------------- KL divergence


LogprobRuns = list[list[list[dict[str, Any]] | None]]  # [item][replicate] -> per-token logprobs or None


@dataclass(frozen=True)
class Encoded:
    """One run's per-token logprobs of one item as arrays (top-k padded with -inf, ids per shared vocab)."""

    ids: np.ndarray  # T x k token ids, -1 for padding
    lp: np.ndarray  # T x k top logprobs, -inf for padding
    actual: np.ndarray  # T logprob of the actual next token (NaN: missing)
    ok: np.ndarray  # T: token has a top dict and a logprob


def encode(tokens: list[dict[str, Any]], vocab: dict[str, int]) -> Encoded:
    k = max((len(t.get("top") or {}) for t in tokens), default=0)
    n = len(tokens)
    ids, lp = np.full((n, k), -1), np.full((n, k), -np.inf)
    actual, ok = np.full(n, np.nan), np.zeros(n, bool)
    for i, t in enumerate(tokens):
        top = t.get("top") or {}
        for j, (tok, v) in enumerate(top.items()):  # dict order kept: argmax ties break as in kl_stats
            ids[i, j] = vocab.setdefault(tok, len(vocab))
            lp[i, j] = v
        if t.get("logprob") is not None:
            actual[i] = t["logprob"]
        ok[i] = bool(top) and t.get("logprob") is not None
    return Encoded(ids, lp, actual, ok)


def fast_kl_stats(b: Encoded, c: Encoded, keys: tuple[str, ...] = ("kld", "same_top", "dp_rms")) -> dict[str, float]:
    """qverify.suites.kld.kl_stats on encoded runs, vectorised over tokens (the same numbers; tested equal)."""
    n = min(len(b.ok), len(c.ok))
    ok = b.ok[:n] & c.ok[:n]
    if not ok.any():
        return {}
    bi, bl, ci, cl = b.ids[:n][ok], b.lp[:n][ok], c.ids[:n][ok], c.lp[:n][ok]
    p, q = np.exp(bl), np.exp(cl)  # padding -> 0
    pvalid = bi >= 0
    match = (bi[:, :, None] == ci[:, None, :]) & pvalid[:, :, None] & (ci[:, None, :] >= 0)
    found = match.any(axis=2)
    q_in = (match * q[:, None, :]).sum(axis=2)
    missing = (pvalid & ~found).sum(axis=1)
    q_rest = np.maximum(1.0 - q.sum(axis=1), 1e-10)
    fill = q_rest / (missing + 1)
    qs = np.where(found, q_in, fill[:, None])
    qs = np.where(pvalid, qs, 0.0)
    p_tail = np.maximum(1.0 - p.sum(axis=1), 0.0)
    q_tail = np.maximum(1.0 - qs.sum(axis=1), 1e-10)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(pvalid & (p > 0), p * np.log(p / np.maximum(qs, 1e-10)), 0.0)
        tail = np.where(p_tail > 1e-8, p_tail * np.log(np.where(p_tail > 0, p_tail, 1.0) / q_tail), 0.0)
    kl = np.maximum(terms.sum(axis=1) + tail, 0.0)
    out: dict[str, float] = {"kld": float(kl.mean()), "n_tokens": float(len(kl))}
    if "same_top" in keys:
        out["same_top"] = float(np.mean(bi[np.arange(len(bi)), bl.argmax(1)] == ci[np.arange(len(ci)), cl.argmax(1)]))
    dp = np.exp(c.actual[:n][ok]) - np.exp(b.actual[:n][ok])
    if "dp_rms" in keys or "dp_mean" in keys:
        out["dp_mean"], out["dp_rms"] = float(dp.mean()), float(np.sqrt((dp ** 2).mean()))
    if "kld_p99" in keys:
        out["kld_p99"] = float(np.percentile(kl, 99))
    return out


def kld_matrices(base: LogprobRuns, cand: LogprobRuns, keys: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per key of kl_stats (kld, same_top, dp_rms, ...): (baseline matrix, candidate matrix).

    Baseline columns: kl(B_k, B_l) for every ordered pair k != l of baseline runs, its own
    run-to-run distance. Candidate columns: kl(B_k, C_j) for every baseline run k and
    candidate run j.
    """
    n = len(base)
    kb = max((len(r) for r in base), default=0)
    kc = max((len(r) for r in cand), default=0)
    bpairs = [(k, l) for k in range(kb) for l in range(kb) if k != l]
    cpairs = [(k, j) for j in range(kc) for k in range(kb)]
    bm = {key: np.full((n, len(bpairs)), np.nan) for key in keys}
    cm = {key: np.full((n, len(cpairs)), np.nan) for key in keys}
    for i in range(n):
        vocab: dict[str, int] = {}
        eb = [encode(x, vocab) if x else None for x in base[i]]
        ec = [encode(x, vocab) if x else None for x in cand[i]]
        for col, (k, l) in enumerate(bpairs):
            _fill(bm, i, col, _get(eb, k), _get(eb, l), keys)
        for col, (k, j) in enumerate(cpairs):
            _fill(cm, i, col, _get(eb, k), _get(ec, j), keys)
    return {key: (bm[key], cm[key]) for key in keys}


def _get(runs: list[Any], k: int) -> Any:
    return runs[k] if k < len(runs) else None


def _fill(m: dict[str, np.ndarray], i: int, col: int, x: Encoded | None, y: Encoded | None, keys: list[str]) -> None:
    if x is None or y is None:
        return
    s = fast_kl_stats(x, y, tuple(keys))
    for key in keys:
        if key in s and not math.isnan(s[key]):
            m[key][i, col] = s[key]


def output_signature(response: Response | None) -> str | None:
    """What 'the same output' means: content plus the parsed calls, in order (ids excluded: servers number them)."""
    if response is None:
        return None
    calls = [(c.name, c.arguments) for c in response.tool_calls]
    return repr((response.content or "", calls, response.finish_reason))
