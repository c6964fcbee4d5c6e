"""The gate's own error rates, beside the anchors' rules, on the same trials.

Rates over independent REAL server sessions (separate launches, each with its own seed salt) are
benchmarks/gate_sessions.py. This script's real mode re-splits the replicates of stored runs: its
trials share one server session per build, so they are not independent and say little about error
rates (kept for the simulate mode, which gate_efficiency.py imports).

Real mode (needs runs with many replicates, e.g. `qverify eval BUILD --replicates 12`):
    python benchmarks/gate_calibration.py --workdir .qverify --baseline bf16 --rebuild bf16 \\
        --lossy nvfp4_all --lossy fp8kv_badscale
  Each trial draws Kb baseline and Kc candidate replicates from the stored ones (disjoint when
  the rebuild is the baseline itself) and gates them, so trials differ by their replicate seeds.
Simulate mode (runs now): `--simulate`, a parametric model of per-item success probabilities;
  fitted to the given runs if --workdir/--baseline are given (each item's rate over its
  replicates, each lossy build's likewise), else built-in defaults at the suites' default sizes.

Conditions: A/A (no change: any FAIL is a false FAIL), each lossy control (any PASS is a false
pass), and injected regressions (a random fraction of the candidate's items answered wrongly in
every replicate) for the power curve. Anchor rules, on replicate 0 of the same trials:
recovery = cand/base rounded to 2 decimals >= 0.95 (llm-compressor), |cand-base| <= 0.08 base
(vLLM rtol), cand >= base - 1 point on one run, and trigger-F1 >= the K2VV floor.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ holds the synthetic-run helpers

from qverify.config import QVerifyConfig
from qverify.gate import gate_candidate
from qverify.gate.loader import RunData, load
from qverify.gate.metrics import expand, specs_for_suite
from qverify.gate.pairwise import f1_floor, trigger_f1
from tests.synth import item_ids, logprob_runs

ANCHOR_KEYS = {"coding": "pass@1", "toolcall": "exact_call", "longctx": "accuracy"}
ANCHORS = ("recovery>=0.95", "rtol 0.08", "1 run, 1 point", "K2VV F1 floor")
LENGTHS = (128, 256, 512, 768, 1024)


# --------------------------------------------------------------------------- trial data


def subset(run: RunData, cols: list[int]) -> RunData:
    lp = [[row[c] for c in cols] for row in run.logprobs] if run.logprobs is not None else None
    return replace(run, replicates=[run.replicates[c] for c in cols], scores={k: m[:, cols] for k, m in run.scores.items()},
                   logprobs=lp)


def inject(run: RunData, frac: float, rng: np.random.Generator) -> RunData:
    """A random `frac` of items answered wrongly in every replicate: higher-is-better scores -> 0, no tool call."""
    hit = rng.random(len(run.items)) < frac
    higher = {s.key for s in expand(specs_for_suite(run.suite), set(run.scores)) if s.statistic == "mean" and s.direction == "higher"}
    scores = {}
    for k, m in run.scores.items():
        m = m.copy()
        if k in higher or k == "tool_call_finish":
            m[hit] = np.where(np.isnan(m[hit]), np.nan, 0.0)
        if k == "schema_accuracy":
            m[hit] = np.nan  # no call, nothing to validate
        scores[k] = m
    return replace(run, scores=scores)


@dataclass
class SuiteModel:
    """Per-item success probabilities of one build on one suite (and KL settings for kld)."""

    suite: str
    p: dict[str, np.ndarray]  # key -> per-item probability; "length" -> bucket per item (longctx)
    kl_shift: float = 0.0
    kl_noise: float = 0.0
    logits: np.ndarray | None = None


def draw(model: SuiteModel, build: str, k: int, rng: np.random.Generator) -> RunData:
    """k fresh replicates from the model, as the gate would load them."""
    if model.suite == "kld":
        n = len(model.logits)
        lps = logprob_runs(model.logits, k, model.kl_noise, model.kl_shift, rng)
        return RunData(build, "kld", None, item_ids("kld", n), list(range(k)), {"has_logprobs": np.ones((n, k))}, lps)
    bern = {key: (rng.random((len(p), k)) < p[:, None]).astype(float) for key, p in model.p.items() if key != "length"}
    n = len(next(iter(bern.values())))
    scores = dict(bern)
    if model.suite == "longctx":
        for length in LENGTHS:
            scores[f"accuracy@{length}"] = np.where((model.p["length"] == length)[:, None], bern["accuracy"], np.nan)
    if model.suite == "verifier":
        calls = bern["tool_call_finish"]
        scores["schema_accuracy"] = np.where(calls == 1, bern["schema_accuracy"], np.nan)
    return RunData(build, model.suite, None, item_ids(model.suite, n), list(range(k)), scores)


def default_models(rng: np.random.Generator, scale: float = 1.0) -> dict[str, SuiteModel]:
    """A baseline like the embedded model (field notes: coding 94%, tools ~100%, long context 37%) served
    with GPU nondeterminism: a share of items flip run to run, 5% at T=0 (coding, longctx), 15% at
    T=0.6 (toolcall), 25% at T=1 (verifier). Assumed, not measured: real mode replaces all of it."""

    def mixed(n: int, acc: float, unstable: float) -> np.ndarray:
        return np.where(rng.random(n) < unstable, rng.uniform(0.15, 0.85, n), (rng.random(n) < acc).astype(float))

    sizes = {"coding": 40, "toolcall": 60, "longctx": 40, "verifier": 60}  # the suites' default_n
    n = {s: max(10, round(v * scale)) for s, v in sizes.items()} | {"kld": 24}  # kld: a fixed corpus
    return {
        "coding": SuiteModel("coding", {"pass@1": mixed(n["coding"], 0.9, 0.05)}),
        "toolcall": SuiteModel("toolcall", {"exact_call": mixed(n["toolcall"], 0.95, 0.15),
                                            "trigger": mixed(n["toolcall"], 0.99, 0.05)}),
        "longctx": SuiteModel("longctx", {"accuracy": mixed(n["longctx"], 0.37, 0.05),
                                          "length": rng.choice(LENGTHS, n["longctx"]).astype(float)}),
        "verifier": SuiteModel("verifier", {"tool_call_finish": mixed(n["verifier"], 0.6, 0.25),
                                            "schema_accuracy": mixed(n["verifier"], 0.97, 0.05),
                                            "hygiene/repetition": mixed(n["verifier"], 0.02, 0.05)}),
        "kld": SuiteModel("kld", {}, kl_noise=0.02, logits=rng.normal(0, 2.5, (n["kld"], 32, 24))),
    }


def damaged(models: dict[str, SuiteModel], frac: float, severity: float, kl_shift: float,
            rng: np.random.Generator) -> dict[str, SuiteModel]:
    """A lossy build: each item damaged with probability `frac`, its success rate cut by `severity`."""
    out = {}
    for s, m in models.items():
        p = {}
        for key, v in m.p.items():
            if key == "length":
                p[key] = v
                continue
            hit = rng.random(len(v)) < frac
            worse = v + severity * (1 - v) if "hygiene" in key else v * (1 - severity)  # hygiene: lower is better
            p[key] = np.where(hit, worse, v)
        out[s] = replace(m, p=p, kl_shift=kl_shift)
    return out


def fitted(pools: dict[str, RunData]) -> dict[str, SuiteModel]:
    """Each item's observed rate over its replicates becomes its probability (a parametric bootstrap)."""
    out = {}
    for s, run in pools.items():
        if s == "kld":
            continue  # logprobs are resampled as whole replicates in real mode; not modelled here
        derived = re.compile(r"accuracy@\d+|pass@1/level\d+|exact_call/.+|finish/.+")  # redrawn from their base keys
        with warnings.catch_warnings():  # items a key never applies to (all NaN) get 0, silently
            warnings.simplefilter("ignore", RuntimeWarning)
            p = {k: np.nan_to_num(np.nanmean(m, axis=1), nan=0.0) for k, m in run.scores.items() if not derived.fullmatch(k)}
        if s == "longctx":
            p["length"] = np.zeros(len(run.items))
            for length in LENGTHS:
                if f"accuracy@{length}" in run.scores:
                    p["length"][(~np.isnan(run.scores[f"accuracy@{length}"])).any(axis=1)] = length
        out[s] = SuiteModel(s, p)
    return out


# --------------------------------------------------------------------------- rules


def anchor_verdicts(base: dict[str, RunData], cand: dict[str, RunData]) -> dict[str, bool]:
    """Each anchor rule's pass/fail, on one run (replicate 0) per build, over the suites it applies to."""
    out = {}
    pairs = [(np.nanmean(base[s].scores[k][:, 0]), np.nanmean(cand[s].scores[k][:, 0]))
             for s, k in ANCHOR_KEYS.items() if s in base and s in cand and k in base[s].scores]
    out["recovery>=0.95"] = all(round(c / b, 2) >= 0.95 if b > 0 else True for b, c in pairs)
    out["rtol 0.08"] = all(abs(c - b) <= 0.08 * abs(b) for b, c in pairs)
    out["1 run, 1 point"] = all(c >= b - 0.01 for b, c in pairs)
    if "verifier" in base and "verifier" in cand:
        b, c = base["verifier"].scores["tool_call_finish"], cand["verifier"].scores["tool_call_finish"]
        floor = f1_floor(b, 0.03)
        out["K2VV F1 floor"] = floor is None or trigger_f1(b[:, 0], c[:, 0]) >= floor
    return out


@dataclass
class Tally:
    n: int = 0
    verdicts: dict[str, int] | None = None
    anchors_fail: dict[str, int] | None = None
    causes: dict[str, int] | None = None

    def add(self, verdict: str, anchors: dict[str, bool], causes: list[str]) -> None:
        self.verdicts = self.verdicts or {"PASS": 0, "FAIL": 0, "INCONCLUSIVE": 0}
        self.anchors_fail = self.anchors_fail or {a: 0 for a in anchors}
        self.causes = self.causes or {}
        self.n += 1
        self.verdicts[verdict] += 1
        for a, ok in anchors.items():
            self.anchors_fail[a] += not ok
        for c in causes:
            self.causes[c] = self.causes.get(c, 0) + 1


# --------------------------------------------------------------------------- trials


class Source:
    """Where a condition's baseline and candidate runs come from: stored replicates, or a model."""

    def __init__(self, base: dict, cand: dict, same_pool: bool = False, simulate: bool = False):
        self.base, self.cand, self.same, self.sim = base, cand, same_pool, simulate

    def draw(self, kb: int, kc: int, rng: np.random.Generator) -> tuple[dict[str, RunData], dict[str, RunData]]:
        if self.sim:
            return ({s: draw(m, "base", kb, rng) for s, m in self.base.items()},
                    {s: draw(m, "cand", kc, rng) for s, m in self.cand.items()})
        base, cand = {}, {}
        for s, run in self.base.items():
            r = len(run.replicates)
            perm = rng.permutation(r)
            base[s] = subset(run, sorted(perm[:kb]))
            other = perm[kb:kb + kc] if self.same else rng.permutation(len(self.cand[s].replicates))[:kc]
            cand[s] = subset(self.cand[s], sorted(other))
        return base, cand


def run_condition(src: Source, trials: int, kb: int, kc: int, cfg: QVerifyConfig, n_boot: int, seed: int,
                  frac: float | None = None) -> tuple[Tally, float]:
    tally, effects = Tally(), []
    for t in range(trials):
        rng = np.random.default_rng([seed, t])
        base, cand = src.draw(kb, kc, rng)
        if frac:
            cand = {s: (r if s == "kld" else inject(r, frac, rng)) for s, r in cand.items()}
        rep = gate_candidate("cand", "cand", base, cand, cfg.thresholds, cfg.alpha)  # n_boot, t: unused since v2
        tally.add(rep.verdict, anchor_verdicts(base, cand),
                  [m.metric for m in rep.metrics if m.gated and m.verdict == rep.verdict != "PASS"])
        effects += [np.nanmean(cand[s].scores[k]) - np.nanmean(base[s].scores[k])
                    for s, k in ANCHOR_KEYS.items() if s in base and k in base[s].scores]
    return tally, float(np.mean(effects)) if effects else float("nan")


LEGEND = ("Each cell: the share of trials with that outcome. A/A (no change): PASS is right, any FAIL is a "
          "false FAIL (target <= 0.05); lossy and injected: FAIL is a detection (target >= 0.95), any PASS a "
          "false pass. Anchors have no INCONCLUSIVE: their 'pass' row is 1 - false FAIL on A/A, the false-pass "
          "rate elsewhere.")


def table(results: dict[str, tuple[Tally, float]]) -> tuple[list[str], list[list[str]]]:
    def rate(x: int, n: int) -> str:
        return f"{x / n:.2f}" if n else "–"

    rows = [[f"qverify {v}"] + [rate(t.verdicts[v], t.n) for t, _ in results.values()]
            for v in ("PASS", "INCONCLUSIVE", "FAIL")]
    for a in ANCHORS:
        if any(a not in (t.anchors_fail or {}) for t, _ in results.values()):
            continue  # not applicable to these suites (the K2VV floor needs verifier runs)
        rows.append([f"{a}: pass"] + [rate(t.n - t.anchors_fail[a], t.n) for t, _ in results.values()])
    rows.append(["mean Δ on primaries (pts)"] + [f"{100 * e:+.1f}" for _, e in results.values()])
    return ["rule"] + list(results), rows


def from_json(path: Path) -> dict[str, tuple[Tally, float]]:
    raw = json.loads(path.read_text())
    return {n: (Tally(r["trials"], r["verdicts"], r["anchors_fail"], r["causes"]), r["mean_effect"]) for n, r in raw.items()}


def markdown(cols: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--simulate", action="store_true", help="parametric model (fitted to --workdir runs if given)")
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--baseline", default="bf16")
    ap.add_argument("--rebuild", help="an identical rebuild (default: the baseline's own disjoint replicates)")
    ap.add_argument("--lossy", action="append", default=None, help="lossy control build (repeat)")
    ap.add_argument("--suites", default="coding,toolcall,longctx,verifier,kld")
    ap.add_argument("--trials", type=int, default=150)
    ap.add_argument("--kb", type=int, default=3, help="baseline replicates per trial")
    ap.add_argument("--kc", type=int, default=3, help="candidate replicates per trial")
    ap.add_argument("--effects", default="0.05,0.1,0.2", help="injected fractions of items answered wrongly")
    ap.add_argument("--scale", type=float, default=1.0, help="simulate: items per suite x this (defaults 40/60/40/60; kld 24)")
    ap.add_argument("--n-boot", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--render", type=Path, help="only print the table of a saved --json result")
    args = ap.parse_args(argv)
    if args.render:
        cols, rows = table(from_json(args.render))
        print(markdown(cols, rows) + "\n\n" + LEGEND)
        return 0
    suites = [s for s in args.suites.split(",") if s]
    cfg = QVerifyConfig(suites=suites)
    rng = np.random.default_rng(args.seed)
    lossy = args.lossy or ["nvfp4_all", "fp8kv_badscale"]

    def pools(build: str) -> dict[str, RunData]:
        return {s: load(args.workdir / "runs", build, s) for s in suites}

    conds: dict[str, Source] = {}
    if args.simulate and args.workdir is None:
        base = {s: m for s, m in default_models(rng, args.scale).items() if s in suites}
        conds["A/A"] = Source(base, base, simulate=True)
        conds["nvfp4_all (sim)"] = Source(base, damaged(base, 0.30, 0.8, 0.6, rng), simulate=True)
        conds["kv-scale corrupt (sim)"] = Source(base, damaged(base, 0.12, 0.6, 0.25, rng), simulate=True)
    elif args.simulate:
        base = fitted(pools(args.baseline))
        conds["A/A"] = Source(base, fitted(pools(args.rebuild)) if args.rebuild else base, simulate=True)
        for b in lossy:
            conds[f"{b} (fit)"] = Source(base, fitted(pools(b)), simulate=True)
    else:
        if args.workdir is None:
            ap.error("real mode needs --workdir (or pass --simulate)")
        bp = pools(args.baseline)
        short = [f"{s}: {len(r.replicates)}" for s, r in bp.items() if len(r.replicates) < args.kb + args.kc]
        if short:
            print(f"need >= {args.kb + args.kc} baseline replicates per suite; have {', '.join(short)}", file=sys.stderr)
            return 4
        same = args.rebuild in (None, args.baseline)
        conds["A/A"] = Source(bp, bp if same else pools(args.rebuild), same_pool=same)
        for b in lossy:
            conds[b] = Source(bp, pools(b))
    aa = conds["A/A"]
    for f in [float(x) for x in args.effects.split(",") if x]:
        conds[f"inject {f:.0%}"] = aa
    results = {}
    for name, src in conds.items():
        t0 = time.time()
        frac = float(name.split()[1].rstrip("%")) / 100 if name.startswith("inject") else None
        results[name] = run_condition(src, args.trials, args.kb, args.kc, cfg, args.n_boot, args.seed, frac)
        t = results[name][0]
        top = sorted((t.causes or {}).items(), key=lambda kv: -kv[1])[:3]
        print(f"{name}: {t.verdicts} in {time.time() - t0:.0f}s; most often deciding: {top}", file=sys.stderr)
    cols, rows = table(results)
    from rich.console import Console
    from rich.table import Table

    tab = Table(title=f"gate calibration: {args.trials} trials per condition, Kb={args.kb}, Kc={args.kc}"
                      f"{' (simulated)' if args.simulate else ''}")
    for c in cols:
        tab.add_column(c)
    for r in rows:
        tab.add_row(*r)
    Console(width=200).print(tab)
    md = markdown(cols, rows) + "\n\n" + LEGEND
    print(md)
    if args.markdown:
        args.markdown.write_text(md + "\n")
    if args.json:
        args.json.write_text(json.dumps({n: {"trials": t.n, "verdicts": t.verdicts, "anchors_fail": t.anchors_fail,
                                             "causes": t.causes, "mean_effect": e} for n, (t, e) in results.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
