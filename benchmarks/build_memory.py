"""Peak host RAM and wall time of the two production builds of Kimi K2.6 as released, on kimi_k25 checkpoints that
grow in layers and experts, against the build code on git `main` (the old path) on the same weights.

    PYTHONPATH=. .venv/bin/python benchmarks/build_memory.py [--sizes 16x128,4x16,8x32,12x64] [--hidden 512]
    PYTHONPATH=. .venv/bin/python benchmarks/build_memory.py --table   # the markdown table docs/build.md shows

Each build runs in its own process (one thread). Peak RSS is the process's `VmHWM` (/proc/self/status), not
`ru_maxrss`: Linux carries `ru_maxrss` across fork+exec, so a child started by a big parent (this script, pytest)
reports the parent's peak. "Above base" subtracts the process's RSS after importing torch, transformers,
llm-compressor and qverify (the libraries' own footprint, which does not grow with the model). The old code cannot read the kimi_k25 wrapper (it exits 3), so it builds a flat copy of the same
checkpoint (the text model's tensors without `language_model.`, no vision tensors): the same weights, its best case.
The old code is slow (it dequantizes and reloads everything) and grows with the whole model, so it runs only on the
sizes in --old-sizes; at the others `--table` extrapolates it linearly in bf16 bytes from the measured old rows
(marked "~"). Checkpoints beyond the template are grown shard by shard (tests/fixtures/kimi_k25_grow.py): making them
with llm-compressor would need ~4x their bf16 bytes.
Results go to benchmarks/results/build_memory.json; docs/build.md extrapolates them to K2.6.
Between consecutive sizes it prints the peak's growth per added byte of routed experts in bf16 (`growth_ratio`): the
machine-independent figure tests/quantize/test_build_memory.py asserts (a build that holds the experts dequantized
grows ~2-3x, a layer-bounded one ~0.3x); the absolute figures here are reported, never asserted.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ("as_shipped", "fp8kv_nvfp4shared")
CALIB = {"calib_samples": 8, "calib_seq_len": 64}


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    return 0


def worker(recipe: str, model: str, workdir: str) -> None:
    """One build in this process; prints one JSON line."""
    import torch

    torch.set_num_threads(1)
    import llmcompressor  # noqa: F401  (the libraries' footprint belongs to the base)
    from llmcompressor import oneshot  # noqa: F401
    from transformers import DeepseekV3ForCausalLM  # noqa: F401

    from qverify.quantize import build

    base = _rss_kb("VmRSS:")
    t0 = time.time()
    out = {"recipe": recipe, "ok": True}
    stages: dict[str, int] = {}

    def on_stage(name: str, seconds: float | None) -> None:
        # the high-water mark when each stage (or progress step) ends: which stage set the peak
        if seconds is not None or name.startswith(("calibrate: layer", "load:")):
            stages[name.split(" (")[0]] = _rss_kb("VmHWM:") * 1024

    try:
        build(recipe, model=model, workdir=workdir, trust_remote_code=True, on_stage=on_stage, **CALIB)
    except Exception as e:  # noqa: BLE001 -- reported, not raised: the old code on a wrapper is expected to fail
        out |= {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
    peak = _rss_kb("VmHWM:")
    out |= {"seconds": round(time.time() - t0, 1), "peak_rss": peak * 1024, "base_rss": base * 1024,
            "peak_above_base": max(0, peak - base) * 1024, "peak_by_stage": stages}
    print("RESULT " + json.dumps(out), flush=True)


def run_build(recipe: str, model: Path, code: Path, tmp: Path) -> dict:
    """One build of `model` with the qverify package under `code`, in a fresh process."""
    env = os.environ | {"PYTHONPATH": f"{code}", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    wd = Path(tempfile.mkdtemp(dir=tmp))
    p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", recipe, str(model), str(wd)],
                       env=env, capture_output=True, text=True, timeout=3600, check=False)
    shutil.rmtree(wd, ignore_errors=True)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return {"recipe": recipe, "ok": False, "error": (p.stderr.strip().splitlines() or ["no output"])[-1][:160]}
    return json.loads(lines[-1][7:])


def flat_copy(wrapper: Path, out: Path) -> Path:
    """The wrapper's text model as a flat Kimi K2 checkpoint (what the old code reads)."""
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((wrapper / "config.json").read_text())
    text = cfg["text_config"] | {"quantization_config": cfg["quantization_config"]}
    (out / "config.json").write_text(json.dumps(text, indent=2))
    for p in sorted(wrapper.glob("*.safetensors")):
        t = {k[len("language_model."):]: v for k, v in load_file(p).items() if k.startswith("language_model.")}
        if t:
            save_file(t, out / p.name, metadata={"format": "pt"})
    for name in ("tiktoken.model", "tokenization_kimi.py", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy2(wrapper / name, out / name)
    return out


def code_at(tmp: Path, ref: str, name: str = "old") -> Path:
    """qverify as on `ref`, unpacked into tmp (read from git, no worktree touched)."""
    dst = tmp / name
    dst.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "qverify"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dst)], input=archive, check=True)
    return dst


def _packed(d: Path) -> int:
    return sum(p.stat().st_size for p in d.glob("*.safetensors"))


def _params(d: Path) -> tuple[int, int]:
    """(all parameters of the text model, routed-expert parameters), counting an INT4 weight by its shape."""
    from qverify.capacity.weights import text_config

    cfg = text_config(json.loads((d / "config.json").read_text()))
    h, m, layers = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["num_hidden_layers"]
    routed = (layers - cfg["first_k_dense_replace"]) * cfg["n_routed_experts"] * 3 * h * m
    from qverify.quantize.manifest import safetensors_header

    other = sum(_numel(i["shape"]) for p in d.glob("*.safetensors") for n, i in safetensors_header(p)[0].items()
                if ".experts." not in n and n.startswith("language_model."))
    return routed + other, routed


def grown_checkpoint(cache: Path, spec: str, hidden: int) -> Path:
    """The LAYERSxEXPERTS (`spec`) kimi_k25 checkpoint at `hidden`, grown from a 2x4 template (both cached)."""
    from tests.fixtures.kimi_k25 import kimi_k25_dir
    from tests.fixtures.kimi_k25_grow import grow_kimi_k25

    template = kimi_k25_dir(Path(cache), layers=2, experts=4, hidden=hidden)
    layers, experts = (int(x) for x in spec.split("x"))
    src = Path(cache) / f"grown-{template.name}-{spec}"
    if not (src / "config.json").is_file():
        grow_kimi_k25(template, src, layers, experts)
    return src


def growth_ratio(small: dict, large: dict, routed_small: int, routed_large: int) -> float:
    """The peak above base's growth from the small checkpoint's build to the large one's, per added byte of routed
    experts in bf16 (2 bytes a parameter). It cancels the libraries' footprint, the allocator's and the part of the
    model both sizes share: ~0.3 for a build that holds one layer's experts at a time, 2-3 for one that holds them
    all dequantized (measured: tests/quantize/test_build_memory.py's docstring)."""
    return (large["peak_above_base"] - small["peak_above_base"]) / (2 * (routed_large - routed_small))


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16x128,4x16,8x32,12x64", help="LAYERSxEXPERTS,... (layer 0 is dense)")
    ap.add_argument("--old-sizes", default="4x16,8x32", help="the sizes the old code runs on (else extrapolated)")
    ap.add_argument("--hidden", type=int, default=512)
    # 0070da0 brought the layer-by-layer build; its parent is the code the issue measured
    ap.add_argument("--old-ref", default="0070da0^", help="git ref of the old code")
    ap.add_argument("--new-ref", default=None, help="git ref of the new code (default: this checkout as it is)")
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "qverify-bench"), help="checkpoint cache")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/build_memory.json"))
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    rows = []
    with tempfile.TemporaryDirectory(prefix="qverify-buildmem-") as t:
        tmp = Path(t)
        old = code_at(tmp, a.old_ref)
        new = code_at(tmp, a.new_ref, "new") if a.new_ref else ROOT
        for spec in a.sizes.split(","):
            src = grown_checkpoint(Path(a.cache), spec, a.hidden)
            runs_old = spec in a.old_sizes.split(",")
            flat = flat_copy(src, tmp / f"flat-{spec}") if runs_old else None
            params, routed = _params(src)
            row = {"size": spec, "params": params, "routed_params": routed, "packed_bytes": _packed(src),
                   "bf16_bytes": 2 * params}
            for recipe in RECIPES:
                print(f"{spec} {recipe} ...", file=sys.stderr, flush=True)
                row[f"new:{recipe}"] = run_build(recipe, src, new, tmp)
                if runs_old:
                    row[f"old:{recipe}"] = run_build(recipe, flat, old, tmp)
                    if spec == a.old_sizes.split(",")[0]:
                        row[f"old-wrapper:{recipe}"] = run_build(recipe, src, old, tmp)
            if flat is not None:
                shutil.rmtree(flat)
            rows.append(row)
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)  # after each size: a partial run keeps its rows
            Path(a.out).write_text(json.dumps({"hidden": a.hidden, "calibration": CALIB, "old_ref": a.old_ref,
                                               "rows": rows}, indent=2) + "\n")
            _print(row)
    _print_growth(rows)


def _print_growth(rows: list[dict]) -> None:
    """growth_ratio between consecutive sizes (by routed parameters), for every code and recipe measured at both."""
    rows = sorted(rows, key=lambda r: r["routed_params"])
    for small, large in itertools.pairwise(rows):
        for key in (k for k in large if ":" in k and k in small):
            a, b = small[key], large[key]
            if a.get("ok") and b.get("ok"):
                g = growth_ratio(a, b, small["routed_params"], large["routed_params"])
                print(f"{small['size']} -> {large['size']} {key}: peak grows {g:.2f}x the added routed bf16 bytes")


def _print(row: dict) -> None:
    mb = 1 / 2**20
    print(f"\n{row['size']}: {row['params'] / 1e6:.0f}M params ({row['routed_params'] / 1e6:.0f}M routed), "
          f"packed {row['packed_bytes'] * mb:.0f} MiB, bf16 {row['bf16_bytes'] * mb:.0f} MiB")
    for recipe in RECIPES:
        new, old = row[f"new:{recipe}"], row.get(f"old:{recipe}", {"ok": True, "error": "not run"})
        cells = []
        for tag, r in (("new", new), ("old(flat)", old)):
            cells.append(f"{tag} peak {r.get('peak_rss', 0) * mb:.0f} MiB (+{r.get('peak_above_base', 0) * mb:.0f} above base) "
                         f"{r.get('seconds', 0):.0f}s{'' if r.get('ok') else ' FAILED ' + r.get('error', '')}")
        print(f"  {recipe:18s} " + " | ".join(cells))
        w = row.get(f"old-wrapper:{recipe}") or {}
        if w.get("ok") is not None:
            print(f"  {'':18s} old on the wrapper: {'ok' if w['ok'] else w.get('error')}")
    sys.stdout.flush()


def old_fit(rows: list[dict], recipe: str) -> tuple[float, float] | None:
    """(intercept, bytes per bf16 byte) of the old code's peak above base, least squares over its measured rows:
    it holds the whole model dequantized (and reloads it to verify), so it grows linearly in the model's bf16 bytes."""
    pts = [(r["bf16_bytes"], r[f"old:{recipe}"]["peak_above_base"]) for r in rows if (r.get(f"old:{recipe}") or {}).get("ok")]
    if len(pts) < 2:
        return None
    n, sx, sy = len(pts), sum(x for x, _ in pts), sum(y for _, y in pts)
    sxx, sxy = sum(x * x for x, _ in pts), sum(x * y for x, y in pts)
    slope = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    return (sy - slope * sx) / n, slope


def _old(r: dict, recipe: str, fit, base: float) -> tuple[float, float | None, str]:
    """(old peak RSS, old seconds or None, '' if measured else '~')."""
    o = r.get(f"old:{recipe}")
    if o and o.get("ok"):
        return o["peak_rss"], o["seconds"], ""
    return base + fit[0] + fit[1] * r["bf16_bytes"], None, "~"


def table(path: str) -> None:
    """The results as the markdown table docs/build.md shows: absolute peak RSS in MiB (the part above the libraries'
    own footprint in brackets), wall seconds; the old code's figures marked ~ are extrapolated (`old_fit`)."""
    rows = sorted(json.loads(Path(path).read_text())["rows"], key=lambda r: r["params"])
    mb = 2**20
    fits = {rc: old_fit(rows, rc) for rc in RECIPES}
    base = sum(r[f"new:{rc}"]["base_rss"] for r in rows for rc in RECIPES) / (2 * len(rows))
    print("| layers x experts | params (routed) | packed | bf16 | as_shipped: new / old | fp8kv_nvfp4shared: new / old | "
          "candidate peak / packed | candidate new / old |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = []
        for rc in RECIPES:
            n = r[f"new:{rc}"]
            o, secs, mark = _old(r, rc, fits[rc], base)
            cells.append(f"{n['peak_rss'] / mb:.0f} (+{n['peak_above_base'] / mb:.0f}), {n['seconds']:.0f} s / "
                         f"{mark}{o / mb:.0f}" + (f", {secs:.0f} s" if secs is not None else ""))
        n = r["new:fp8kv_nvfp4shared"]
        o, _, mark = _old(r, "fp8kv_nvfp4shared", fits["fp8kv_nvfp4shared"], base)
        print(f"| {r['size']} | {r['params'] / 1e6:.0f}M ({r['routed_params'] / 1e6:.0f}M) | {r['packed_bytes'] / mb:.0f} | "
              f"{r['bf16_bytes'] / mb:.0f} | {cells[0]} | {cells[1]} | {n['peak_rss'] / r['packed_bytes']:.2f}x | "
              f"{mark}{n['peak_rss'] / o:.2f}x |")
    for rc, f in fits.items():
        if f:
            print(f"\nold {rc}: peak above base = {f[0] / mb:.0f} MiB + {f[1]:.2f} x bf16 bytes (fit over the measured rows)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:5])
    elif len(sys.argv) > 1 and sys.argv[1] == "--table":
        table(sys.argv[2] if len(sys.argv) > 2 else str(ROOT / "benchmarks/results/build_memory.json"))
    else:
        main()
