"""What a build buys and costs, from build.json and run manifests: recipe changes, capacity, performance.

Shared by the report, the plots and the MLflow metrics so the three never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from qverify.models import BuildManifest
from qverify.reports.bundle import GateBundle, perf_value
from qverify.reports.formatting import fmt_bytes

GIB = 2**30


@dataclass
class BuildFacts:
    build_id: str
    recipe: str
    weights_bytes: int | None
    kv_dtype: str | None
    kv_bytes_per_token: int | None
    weights_change: float | None = None  # fraction vs the baseline, -0.12 = 12% smaller
    kv_tokens_ratio: float | None = None  # KV tokens per byte of cache vs the baseline, 2.0 = twice the tokens
    ttft_s: float | None = None
    decode_tok_s: float | None = None
    accept_length: float | None = None
    projection: dict[str, Any] = field(default_factory=dict)  # the capacity planner at production scale

    @property
    def kv_tokens_per_gib(self) -> float | None:
        return GIB / self.kv_bytes_per_token if self.kv_bytes_per_token else None


def build_facts(bundle: GateBundle) -> list[BuildFacts]:
    """One row per build, baseline first; ratios are against the baseline."""
    rows = []
    for b in bundle.build_ids:
        m = bundle.builds.get(b)
        perf = bundle.perf(b)
        ttft = perf_value(perf, "ttft")
        if ttft is not None and any("ttft_ms" in k for k in perf):
            ttft /= 1000.0
        rows.append(BuildFacts(
            build_id=b, recipe=bundle.recipe(b),
            weights_bytes=m.total_bytes or None if m else None,
            kv_dtype=m.kv_dtype if m else None,
            kv_bytes_per_token=m.kv_bytes_per_token or None if m else None,
            ttft_s=ttft, decode_tok_s=perf_value(perf, "decode", "tok_s", "tokens_per_s"),
            accept_length=perf_value(perf, "accept"),
        ))
    base = rows[0]
    for r in rows:
        if base.weights_bytes and r.weights_bytes:
            r.weights_change = r.weights_bytes / base.weights_bytes - 1.0
        if base.kv_bytes_per_token and r.kv_bytes_per_token:
            r.kv_tokens_ratio = base.kv_bytes_per_token / r.kv_bytes_per_token
    _project(bundle, rows)
    return rows


def _project(bundle: GateBundle, rows: list[BuildFacts]) -> None:
    """What each recipe buys on the production model (gate config `capacity`, default Kimi K2.6 on B200s with the
    kimi-k2.6 profile's mem_fraction_static, as SGLang sizes its pool: qverify/capacity/sglang_pool.py).

    Uses qverify.capacity when it is importable and knows the recipe; otherwise the
    report shows only the measured figures above.
    """
    spec = {"config": "kimi-k2.6", "gpu": "b200", "context": 100_000, "profile": "kimi-k2.6",
            **(bundle.gate.config.get("capacity") or {})}
    try:
        from qverify.capacity.planner import plan
        from qverify.capacity.quantplan import quant_plan
        from qverify.capacity.sources import load_config
        from qverify.serve.profile import load_profile

        cfg, name = load_config(str(spec["config"]))
        fraction = spec.get("mem_fraction")
        if fraction is None and spec.get("profile"):
            fraction = load_profile(str(spec["profile"])).flags.get("mem_fraction_static")
    except Exception:  # noqa: BLE001 - the planner is optional for the report
        return
    kw = {"gpu": str(spec["gpu"]), "context": int(spec["context"]), "model_name": name,
          "mem_fraction": None if fraction is None else float(fraction)}
    if "tp" not in spec:  # the smallest TP on which the baseline fits, so every recipe is compared on one footprint
        try:
            base_plan = quant_plan(rows[0].recipe)
            spec["tp"] = next((t for t in (1, 2, 4, 8, 16, 32, 64) if plan(cfg, base_plan, tp=t, **kw).fits), 64)
        except Exception:  # noqa: BLE001
            spec["tp"] = 8
    for r in rows:
        try:
            p = plan(cfg, quant_plan(r.recipe), tp=int(spec["tp"]), **kw)
        except Exception as e:  # noqa: BLE001 - a recipe the planner cannot price keeps its measured figures only
            r.projection = {"error": str(e).split(":")[-1].strip()[:120]}
            continue
        # weights per GPU as `qverify capacity` prints it: TP-replicated modules whole on every rank
        r.projection = {"model": name, "gpu": p.gpu, "tp": p.tp, "weights_bytes": p.weights.total_bytes,
                        "weights_per_gpu_bytes": p.weights_per_gpu_bytes,
                        "kv_tokens_per_replica": p.kv_tokens_per_replica, "sessions": p.sessions_at_context,
                        "context": p.context_tokens, "fits": p.fits}


def _scheme_line(s: Any) -> str:
    targets = ", ".join(s.targets[:3]) + (" …" if len(s.targets) > 3 else "")
    what = f"{s.modules} Linear modules ({s.params / 1e6:.2f}M params)" if s.modules else "the KV cache"
    return f"{s.scheme} on {what}" + (f", targets {targets}" if targets else "") + (f", format {s.format}" if s.format else "")


def _serving_changes(base: dict, cand: dict) -> list[str]:
    out = []
    for k, v in cand.items():
        if base.get(k) != v:
            was = f" (was {base[k]})" if k in base else ""
            out.append(f"serving {k} = {v}{was}")
    return out + [f"serving {k} removed (was {v})" for k, v in base.items() if k not in cand]


def recipe_changes(base: BuildManifest | None, cand: BuildManifest | None) -> list[str]:
    """Plain-language differences a reviewer needs: schemes, KV dtype, drafter, serving settings, size."""
    if cand is None:
        return ["build.json not found: the recipe's changes are unknown"]
    out: list[str] = []
    base_schemes = {(s.scheme, tuple(s.targets)) for s in (base.quantization if base else [])}
    for s in cand.quantization:
        # a KV-cache scheme is said once, as the KV dtype line below
        if (s.scheme, tuple(s.targets)) not in base_schemes and not s.scheme.startswith("kv_cache"):
            out.append(_scheme_line(s))
    if base is None or cand.kv_dtype != base.kv_dtype:
        out.append(f"KV cache {base.kv_dtype if base else '?'} → {cand.kv_dtype}")
    if cand.drafter and (base is None or cand.drafter != base.drafter):
        out.append(f"drafter {cand.drafter}")
    out += _serving_changes(base.serving if base else {}, cand.serving)
    if base and base.total_bytes and cand.total_bytes and base.total_bytes != cand.total_bytes:
        out.append(f"weights {fmt_bytes(base.total_bytes)} → {fmt_bytes(cand.total_bytes)}")
    if base and base.source_hash != cand.source_hash:
        out.append("⚠ built from a different source model than the baseline")
    return out or ["no quantization or serving change against the baseline (an A/A rebuild)"]
