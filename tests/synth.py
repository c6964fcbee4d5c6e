"""Synthetic runs with known effects, written through the real RunStore.

For the gate's tests and the `--simulate` mode of benchmarks/gate_calibration.py: the
score matrices are what a suite's scorer would have emitted, per item and replicate.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import numpy as np

from qverify.evals.store import RunStore
from qverify.models import BuildManifest, ItemResult, Response, RunManifest, Sampling, ServingProfile, content_hash

SUITE_VERSION = "1"


def item_ids(suite: str, n: int) -> list[str]:
    return [f"{suite}-{i:04d}" for i in range(n)]


def bernoulli(p: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """n x k 0/1 outcomes, item i succeeding with probability p[i] in each replicate."""
    return (rng.random((len(p), k)) < np.asarray(p)[:, None]).astype(float)


def results(suite: str, ids: list[str], scores: dict[str, np.ndarray], errors: np.ndarray | None = None,
            logprobs: list[list[Any]] | None = None, seed0: int = 0,
            length: np.ndarray | None = None) -> dict[int, list[ItemResult]]:
    """ItemResults from per-key n x K matrices; NaN leaves the key out, errors[i, k] makes an infra error,
    length[i, k] an answer cut at max_tokens (finish_reason "length")."""
    k = next(iter(scores.values())).shape[1] if scores else len(logprobs[0])
    out: dict[int, list[ItemResult]] = {}
    for r in range(k):
        rows = []
        for i, iid in enumerate(ids):
            if errors is not None and errors[i, r]:
                rows.append(ItemResult(item_id=iid, suite=suite, replicate=r, seed=seed0 + r, request_hash="x",
                                       error="ConnectError"))
                continue
            vals = {key: float(m[i, r]) for key, m in scores.items() if not math.isnan(m[i, r])}
            lp = logprobs[i][r] if logprobs is not None else None
            finish = "length" if length is not None and length[i, r] else "stop"
            resp = Response(content="", finish_reason=finish, logprobs=lp)
            rows.append(ItemResult(item_id=iid, suite=suite, replicate=r, seed=seed0 + r, request_hash="x",
                                   response=resp, scores=vals))
        out[r] = rows
    return out


def write_run(runs_root: Path, build_id: str, suite: str, res: dict[int, list[ItemResult]], n_items: int | None = None,
              complete: bool = True, item_set_hash: str | None = None, suite_version: str = SUITE_VERSION,
              sampling: Sampling | None = None, error_budget: float = 0.02, manifest_build_id: str | None = None) -> RunStore:
    store = RunStore(runs_root / build_id / suite)
    for k, rows in res.items():
        with store.writer(k) as w:
            for row in rows:
                w.append(row)
    ids = sorted({r.item_id for rows in res.values() for r in rows})
    n_err = sum(r.error is not None for rows in res.values() for r in rows)
    total = sum(len(rows) for rows in res.values())
    store.write_manifest(RunManifest(
        build_id=manifest_build_id or build_id, suite=suite, suite_version=suite_version,
        item_set_hash=item_set_hash or content_hash(ids), n_items=n_items or len(ids), replicates=len(res),
        sampling=sampling or Sampling(), serving=ServingProfile(), error_budget=error_budget,
        error_rate=n_err / total if total else 0.0, complete=complete))
    return store


def write_build(builds_root: Path, build_id: str, recipe: str, manifest_build_id: str | None = None,
                target: str = "t0", drafter: str = "d0") -> Path:
    """A build.json only; `target` / `drafter` name its content (one tensor hash each), which is what
    greedy/match's reference is found by (qverify.gate.reference)."""
    d = builds_root / build_id
    d.mkdir(parents=True, exist_ok=True)
    hashes = {"model.safetensors::w": target, "drafter/model.safetensors::w": drafter}
    bm = BuildManifest(build_id=manifest_build_id or build_id, recipe=recipe, recipe_hash="r", recipe_text="",
                       source_model="synthetic", source_hash="s", tensor_hashes=hashes)
    (d / "build.json").write_text(bm.model_dump_json(indent=2))
    return d


# --------------------------------------------------------------------------- logprobs (kld)


def logprob_runs(base_logits: np.ndarray, k: int, run_noise: float, shift: float, rng: np.random.Generator,
                 top: int = 5) -> list[list[list[dict[str, Any]]]]:
    """Per item and replicate, per-token {token, logprob, top} from logits perturbed per run.

    base_logits: items x tokens x vocab. `shift` is a fixed perturbation of this build (its
    quantization error, same in every run); `run_noise` is fresh per run (nondeterminism).
    """
    n, t, v = base_logits.shape
    build_err = rng.normal(0, 1, base_logits.shape) * shift
    nxt = base_logits.argmax(axis=2)  # the prompt's actual next tokens: the same in every run
    out = []
    for i in range(n):
        reps = []
        for _ in range(k):
            logits = base_logits[i] + build_err[i] + rng.normal(0, 1, (t, v)) * run_noise
            mx = logits.max(1, keepdims=True)
            lp = logits - mx - np.log(np.exp(logits - mx).sum(1, keepdims=True))
            order = np.argsort(-lp, axis=1)[:, :top]
            tops = np.take_along_axis(lp, order, axis=1).tolist()
            reps.append([{"token": f"t{nxt[i, j]}", "logprob": float(lp[j, nxt[i, j]]),
                          "top": {f"t{o}": x for o, x in zip(order[j].tolist(), tops[j])}} for j in range(t)])
        out.append(reps)
    return out


# Issue 29's heavy-tailed per-item KL (tests/gate/test_kld_tails.py, benchmarks/gate_oc_rows.py): the baseline's own
# KL per item is Gamma(0.5) with mean KL_SELF; a candidate's is lognormal or Lomax; kld/kld's tolerance is KL_TOL.
KL_TOL, KL_SELF = 0.01, 0.002


def kl_draw(family: str, shape: float, mean: float, size, rng: np.random.Generator) -> np.ndarray:
    if family == "lognormal":
        return rng.lognormal(np.log(mean) - shape ** 2 / 2, shape, size)
    return rng.pareto(shape, size) * mean * (shape - 1)  # Lomax: tail index `shape`, mean `mean`


@functools.cache
def kl_mean_for(family: str, shape: float, excess: float) -> float:
    """The candidate's raw mean KL whose capped mean exceeds the baseline's capped own KL by `excess` (bisection on
    1M draws)."""
    from qverify.suites.kld import KLD_CAP

    base = np.minimum(np.random.default_rng(0).gamma(0.5, KL_SELF / 0.5, 1_000_000), KLD_CAP).mean()
    lo, hi = KL_SELF / 10, 100 * KL_TOL
    for _ in range(22):
        mid = (lo + hi) / 2
        capped = np.minimum(kl_draw(family, shape, mid, 1_000_000, np.random.default_rng(1)), KLD_CAP).mean()
        lo, hi = (mid, hi) if capped - base < excess else (lo, mid)
    return (lo + hi) / 2


def kl_bounds(family: str, shape: float, excess: float, n: int, trials: int, rng: np.random.Generator,
              exact: bool = True) -> tuple[Any, float]:
    """kld/kld's bounds as the gate measures them (capped per item, rule.measure), vectorised over `trials` rows of
    n items, and the candidate's raw mean KL. Oriented higher-is-better: PASS when lower > -KL_TOL."""
    from qverify.gate.rule import Evidence, measure
    from qverify.suites.kld import KLD_CAP

    m = kl_mean_for(family, shape, excess)
    own = np.minimum(rng.gamma(0.5, KL_SELF / 0.5, (trials, n)), KLD_CAP)
    cand = np.minimum(kl_draw(family, shape, m, (trials, n), rng), KLD_CAP)
    ev = Evidence("kld/kld", "lower", KL_TOL, cand - own, bounded=True, scale=KLD_CAP, always_exact=exact)
    return measure(ev, 0.05), m


def kl_tail_sample(shape: float, share: float, excess: float, n: int, trials: int, rng: np.random.Generator,
                   own_zero: bool = False, height: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(baseline own, candidate) per-item KL capped at KLD_CAP, trials x n, for issue 35.5's light and
    candidate-only-tail models: the candidate's KL lognormal with log-scale SD `shape` (0.66: the real
    fp8kv_nvfp4shared build's, docs/gate-results.md) except a `share` of its items at `height` (default the cap),
    the light part's mean set so that the capped excess is `excess`; the baseline's own KL Gamma(0.5) with mean KL_SELF, or 0 (own_zero: a
    deterministic engine's). Light KL of these shapes reaches the cap with probability < 1e-6, so its capped mean is
    its mean."""
    from qverify.suites.kld import KLD_CAP

    base = 0.0 if own_zero else float(np.minimum(np.random.default_rng(0).gamma(0.5, KL_SELF / 0.5, 1_000_000),
                                                 KLD_CAP).mean())
    own = np.zeros((trials, n)) if own_zero else np.minimum(rng.gamma(0.5, KL_SELF / 0.5, (trials, n)), KLD_CAP)
    height = KLD_CAP if height is None else height
    light = (excess + base - share * height) / (1 - share)
    with np.errstate(divide="ignore"):  # excess 0 with own_zero: the candidate's KL is 0 too
        cand = kl_draw("lognormal", shape, light, (trials, n), rng)
    return own, np.minimum(np.where(rng.random((trials, n)) < share, height, cand), KLD_CAP)


# Issue 35.1: a candidate that loses items outright, its errored requests falling on the items it loses.
NOISY = (0.60, 0.15)  # benchmarks/gate_oc.py's "noisy" model: always right, always wrong; the rest p ~ U(0.15, 0.85)


def lost_items_with_errors(rng: np.random.Generator, n: int = 300, k: int = 3, delta: float = -0.03,
                           error_share: float = 0.019, coupling: float = 0.5, where: str = "lost"
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(baseline, candidate, candidate errors), n x k each: a toolcall-like suite (NOISY) whose candidate loses a
    share of its items outright (p -> 0) for a population Δ of `delta`; floor(error_share n k) of the candidate's
    requests error, on the lost items ("lost", item by item), at random ("random"), or none ("none")."""
    r, w = NOISY
    u = rng.random(n)
    p = np.where(u < r, 1.0, np.where(u < r + w, 0.0, 0.15 + 0.7 * rng.random(n)))
    lost = rng.random(n) < -delta / (r + (1 - r - w) * 0.5)
    q = np.where(lost, 0.0, p)
    ub = rng.random((n, k))
    uc = np.where(rng.random((n, k)) < coupling, ub, rng.random((n, k)))
    b, c = (ub < p[:, None]).astype(float), (uc < q[:, None]).astype(float)
    m = int(error_share * n * k)
    err = np.zeros((n, k), bool)
    if where == "lost":
        cells = np.flatnonzero(np.repeat(lost & (p > 0), k))[:m]  # the lost items the baseline gets right
        err.flat[cells] = True
    elif where == "random":
        err.flat[rng.choice(n * k, m, replace=False)] = True
    return b, c, err
