"""GPU acceptance run on SGLang 0.5.23: one command, no download, able to FAIL a build SGLang serves wrongly.

    bash benchmarks/gpu/sglang_smoke.sh [--dry-run] [--tp 4] [--sm100]

It serves on SGLang, at TP1, qverify-tiny's builds (bf16, fp8kv, fp8kv_badscale and the candidate
fp8kv_nvfp4shared_fp8drafter with its FP8 drafter), and, at --tp, a kimi_k25 fixture made on the host with Kimi's
attention shapes (64 heads: 16 per rank at TP4; q_lora 1536, qk_nope 128 + rope 64, v 128, kv_lora 512), as_shipped
and fp8kv, so the production MLA kernels run at production shapes. Each check's rule is a pure function in
acceptance_checks.py (its PLAN is what the dry run prints); the host-side numerics are in acceptance_host.py.
1. Before anything starts: bubblewrap works (the coding suite's sandbox; GPU containers often block it).
2. Engine vs SGLang: SGLang's greedy tokens and logprobs (`/generate`, input ids, 32 tokens, 6 prompts) against the
   embedded engine's logprobs for the same tokens on the same build (prefill, then one decode step per token), for
   bf16 and fp8 KV, on both models, within a tolerance derived from the two numerics (acceptance_checks docstring).
   The engine serves the kimi fixture's flat twin (the same weights; it refuses wrapper builds).
3. The comparison's power: without its FP8 emulation the engine must sit twice as far from SGLang's FP8 server.
4. The live k_scale, read from the server's own outputs (engine at k = 1 and k = 0.25: the server matches one).
5. The FP8 drafter drafts (candidate: spec_accept_length > 1).
6. `qverify eval` + `qverify gate --fixed` on qverify-tiny (toolcall, kld, coding): fp8kv_badscale must FAIL where
   the attention backend reads k_scale (trtllm_mla, cutedsl_mla; elsewhere SGLang serves it as fp8kv and it must
   not FAIL); the candidate must not FAIL.
7. Reports numerics CPU code cannot know: each server's resolved attention backend, page size, chunked prefill, KV
   dtype; whether the FP8 decode kernel rounds beyond the engine's model (softmax probabilities to FP8).
Backends: SM100 (B200) uses trtllm_mla, SGLang's default there; elsewhere flashinfer, pinned, because the engine does
not emulate fa3 (H200's default). Results: $WORKDIR/acceptance.json; exit 1 on a FAIL, 3 on infrastructure.
Not yet run on a GPU (none lent so far): its time (target: 15 minutes on one H200) is unmeasured.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from benchmarks.gpu import acceptance_checks as checks
from benchmarks.gpu import acceptance_host as host

CANDIDATE = "fp8kv_nvfp4shared_fp8drafter"
TINY_RECIPES = ("bf16", "fp8kv", "fp8kv_badscale", CANDIDATE)
KIMI_RECIPES = ("as_shipped", "fp8kv")
# served: name -> (model, recipe, uses the drafter)
SERVED = {"tiny-bf16": ("tiny", "bf16", False), "tiny-fp8kv": ("tiny", "fp8kv", False),
          "tiny-badscale": ("tiny", "fp8kv_badscale", False), "tiny-candidate": ("tiny", CANDIDATE, True),
          "kimi-bf16": ("kimi", "as_shipped", False), "kimi-fp8kv": ("kimi", "fp8kv", False)}
DECODE_TOKENS = 32
GATE_SUITES = "toolcall,kld,coding"


class Run:
    def __init__(self, args: argparse.Namespace):
        self.args, self.dry = args, args.dry_run
        self.work = Path(args.workdir)
        self.work.mkdir(parents=True, exist_ok=True)
        self.results: list[dict] = []
        self.qv_python = sys.executable
        self.tokens = 8 if self.dry else DECODE_TOKENS  # greedy tokens per prompt (the dry run: fewer, on CPU)

    def qv(self, *argv: str, check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess:
        cmd = [self.qv_python, "-m", "qverify", "--workdir", str(self.work / "wd"), *argv]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd or REPO, check=False)
        if check and r.returncode != 0:
            raise SystemExit(f"infrastructure: {shlex.join(cmd)} exited {r.returncode}\n{r.stderr[-3000:]}")
        return r

    def record(self, name: str, outcome: checks.Outcome) -> None:
        self.results.append({"check": name, "status": outcome.status, "detail": outcome.detail})
        print(f"{outcome.status:5} {name}: {outcome.detail}", flush=True)

    def backend(self, model: str) -> str:
        return "trtllm_mla" if self.args.sm100 else "flashinfer"

    def tp(self, model: str) -> int:
        return self.args.tp if model == "kimi" else 1  # qverify-tiny has 4 heads: one GPU


# ----------------------------------------------------------------------------- builds, profiles, commands


def sources(run: Run) -> dict[str, tuple[Path, Path]]:
    """model -> (what SGLang serves, what the engine serves): qverify-tiny itself; the kimi_k25 fixture and its twin."""
    from qverify.assets import default_model_dir

    wrapper = host.kimi_fixture(run.work / "fixtures")
    return {"tiny": (default_model_dir(), default_model_dir()),
            "kimi": (wrapper, host.flat_twin(wrapper, run.work / "fixtures" / f"{wrapper.name}-flat"))}


def build(run: Run, recipe: str, src: Path) -> dict:
    argv = ["--json", "build", "--recipe", recipe, "--model", str(src), "--trust-remote-code"]
    out = json.loads(run.qv(*argv).stdout)
    from qverify.workdir import read_build_manifest_dict

    return read_build_manifest_dict(Path(out["build_dir"])) | {"build_dir": out["build_dir"]}


def profile(run: Run, name: str, model: str, drafter: bool) -> Path:
    extra = ["--attention-backend", run.backend(model), "--cuda-graph-max-bs-decode", "8"]
    flags = {"trust_remote_code": True, "mem_fraction_static": 0.6, "tool_call_parser": "kimi_k2",
             "reasoning_parser": None, "use_drafter": drafter, "enable_metrics": True, "random_seed": 0,
             "extra_args": extra}
    if drafter:
        flags |= {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
    path = run.work / f"{name}.yaml"
    path.write_text(json.dumps({"description": f"acceptance: {name}", "backend": "sglang", "tp": run.tp(model),
                                "max_tokens": {"*": 256}, "flags": flags}))
    return path


def command(run: Run, build_id: str, prof: Path) -> list[str]:
    # the Kimi tokenizer is remote code: allowed here, by the user's flag, never by build.json (issue 31)
    return json.loads(run.qv("--json", "serve", build_id, "--profile", str(prof), "--port", str(run.args.port),
                             "--trust-remote-code", "--dry-run").stdout)["command"]


def parse_with_sglang(argv: list[str]):
    """SGLang's own `prepare_server_args` (what `python -m sglang.launch_server` runs first) on the argv."""
    import contextlib
    import io

    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    i = argv.index("sglang.launch_server")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            sa = prepare_server_args(argv[i + 1:])
    except SystemExit:
        raise SystemExit(f"bad input: SGLang rejects {shlex.join(argv)}: {err.getvalue().strip()[-500:]}") from None
    SpeculativeAlgorithm.from_string(sa.speculative_algorithm)
    return sa


# ----------------------------------------------------------------------------- GPU steps


class Served:
    """`qverify serve` in the background (the same command the dry run parsed), stopped on exit."""

    def __init__(self, run: Run, build_id: str, prof: Path):
        self.run, self.build_id, self.prof = run, build_id, prof

    def __enter__(self) -> Self:
        out = self.run.work / f"serve-{self.prof.stem}.json"
        out.unlink(missing_ok=True)
        cmd = [self.run.qv_python, "-m", "qverify", "--workdir", str(self.run.work / "wd"), "--json", "serve",
               self.build_id, "--profile", str(self.prof), "--port", str(self.run.args.port),
               "--ready-timeout", str(self.run.args.ready_timeout), "--trust-remote-code"]
        self.proc = subprocess.Popen(cmd, stdout=out.open("w"), stderr=subprocess.PIPE, text=True, cwd=REPO)
        while not out.read_text().rstrip().endswith("}"):
            if self.proc.poll() is not None:
                raise SystemExit(f"infrastructure: serve exited {self.proc.returncode}: {self.proc.stderr.read()[-3000:]}")
            time.sleep(2)
        self.url = f"http://127.0.0.1:{self.run.args.port}"
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=300)

    def post(self, path: str, body: dict) -> dict:
        import httpx

        return httpx.post(self.url + path, json=body, timeout=600).raise_for_status().json()

    def server_info(self) -> dict:
        import httpx

        return httpx.get(self.url + "/server_info", timeout=60).raise_for_status().json()

    def greedy(self, ids: list[int], n: int) -> tuple[list[int], list[float]]:
        """SGLang's greedy tokens and their logprobs (meta_info.output_token_logprobs: (logprob, id, text))."""
        r = self.post("/generate", {"input_ids": ids, "return_logprob": True, "sampling_params": {
            "max_new_tokens": n, "temperature": 0, "ignore_eos": True}})
        rows = r["meta_info"]["output_token_logprobs"]
        return [int(x[1]) for x in rows], [float(x[0]) for x in rows]


def serve_all(run: Run, builds: dict, profiles: dict, prompts: dict) -> dict:
    """Each served build: its resolved numerics, and its greedy tokens + logprobs on the model's prompts (the
    candidate: its drafter's accept lengths instead)."""
    served = {}
    for name, (model, recipe, _) in SERVED.items():
        with Served(run, builds[model][recipe]["sglang"]["build_id"], profiles[name]) as srv:
            info = srv.server_info()
            run.record(f"numerics of {name}", checks.Outcome("info", json.dumps(checks.server_numerics(info))))
            if name == "kimi-fp8kv":
                plan = json.loads(run.qv("--json", "capacity", srv.build_id, "--profile", str(profiles[name]),
                                         *host.gpu_flags()).stdout)
                tokens = info.get("max_total_num_tokens") or (info.get("scheduler_info") or {}).get("max_total_num_tokens")
                run.record("KV capacity of the kimi fixture's fp8kv server",
                           checks.capacity_close(tokens, plan["kv_tokens_per_replica"]))
            if name == "tiny-candidate":
                accept = [(srv.post("/v1/chat/completions", {"model": srv.build_id, "max_tokens": 64, "temperature": 0,
                                                             "return_meta_info": True, "messages": [
                    {"role": "user", "content": p}]})["choices"][0].get("meta_info") or {}).get("spec_accept_length")
                    for p in host.PROMPTS[:3]]
                run.record("FP8 drafter drafts", checks.spec_accept(accept))
                continue
            served[name] = [srv.greedy(ids, run.tokens) for ids in prompts[model]]
    return served


def compare(run: Run, builds: dict, prompts: dict, served: dict) -> None:
    """The engine against each server's tokens; every rule from acceptance_checks."""
    from qverify.serve.embedded.model_loader import load_for_serving

    def lm(model: str, recipe: str):
        return load_for_serving(builds[model][recipe]["engine"]["build_dir"], speculative=False, trust_remote_code=True)

    def flat(xs):
        return [x for row in xs for x in row]

    for model, bf16, fp8 in (("tiny", "bf16", "fp8kv"), ("kimi", "as_shipped", "fp8kv")):
        backend, base, cand = run.backend(model), lm(model, bf16), lm(model, fp8)
        pairs, pairs8 = (list(zip(prompts[model], served[f"{model}-{k}"])) for k in ("bf16", "fp8kv"))
        noise = flat(host.bf16_noise(base, p, out) for p, (out, _) in pairs)
        eng = [host.engine_logprobs(base, p, out, backend=backend) for p, (out, _) in pairs]
        sg = [lps for _, (_, lps) in pairs]
        tol = checks.tolerance(noise)
        run.record(f"engine vs SGLang, {model} {bf16} (bf16 KV)", checks.engine_agrees(checks.gaps(flat(sg), flat(eng)), tol))
        eng8 = [host.engine_logprobs(cand, p, out, backend=backend) for p, (out, _) in pairs8]
        plain = flat(host.engine_logprobs(cand, p, out, backend=backend, fp8=False) for p, (out, _) in pairs8)
        sg8 = [lps for _, (_, lps) in pairs8]
        tol8 = checks.tolerance(noise, checks.gaps(flat(eng8), plain))
        g8 = checks.gaps(flat(sg8), flat(eng8))
        run.record(f"engine vs SGLang, {model} {fp8} (fp8_e4m3 KV)", checks.engine_agrees(g8, tol8))
        run.record(f"the comparison can tell FP8 from bf16 KV ({model})",
                   checks.fp8_emulation_needed(g8, checks.gaps(flat(sg8), plain), tol8))
        split8 = [(checks.gaps(a[:1], b[:1]), checks.gaps(a[1:], b[1:])) for a, b in zip(sg8, eng8)]
        split16 = [(checks.gaps(a[:1], b[:1]), checks.gaps(a[1:], b[1:])) for a, b in zip(sg, eng)]
        run.record(f"numerics CPU code cannot know: FP8 decode kernel ({model}, {backend})", checks.decode_numerics(
            flat(f for f, _ in split8), flat(d for _, d in split8), flat(f for f, _ in split16),
            flat(d for _, d in split16), tol8))
        if model == "tiny":
            live_scales(run, lm(model, "fp8kv_badscale"), cand, prompts[model], served, backend, tol8)


def stand_in(run: Run, builds: dict, prompts: dict) -> dict:
    """The dry run's SGLang: the engine's own greedy tokens and logprobs (badscale at its declared k_scale, which
    only trtllm_mla/cutedsl_mla read), so compare() runs end to end on CPU and its checks must pass."""
    from qverify.serve.embedded.model_loader import load_for_serving

    served = {}
    for name, (model, recipe, drafter) in SERVED.items():
        if drafter:
            continue
        lm = load_for_serving(builds[model][recipe]["engine"]["build_dir"], speculative=False, trust_remote_code=True)
        scales = lm.sglang_kv_scales or None
        rows = []
        for p in prompts[model]:
            out = host.engine_greedy(lm, p, run.tokens, backend=run.backend(model), scales=scales)
            rows.append((out, host.engine_logprobs(lm, p, out, backend=run.backend(model), scales=scales)))
        served[name] = rows
    return served


def live_scales(run: Run, bad, good, prompts: list, served: dict, backend: str, tol: float) -> None:
    layers = range(len(good.model.model.layers))
    for name, lmod, declared in (("tiny-fp8kv", good, 1.0), ("tiny-badscale", bad, 0.25)):
        by = {}
        for k in (1.0, 0.25):
            eng = [x for p, (out, _) in zip(prompts, served[name])
                   for x in host.engine_logprobs(lmod, p, out, backend=backend, scales=dict.fromkeys(layers, k))]
            by[k] = checks.gaps([lp for _, lps in served[name] for lp in lps], eng)
        run.record(f"live k_scale of {name.removeprefix('tiny-')} is {declared:g}",
                   checks.live_k_scale(by, declared, backend, tol))


def gate(run: Run, builds: dict, profiles: dict) -> None:
    ids = {r: builds["tiny"][r]["sglang"]["build_id"] for r in ("bf16", "fp8kv_badscale", CANDIDATE)}
    for bid in ids.values():
        run.qv(*eval_argv(run, bid, profiles["tiny-candidate"]))
    r = run.qv("--json", *gate_argv(ids), check=False)
    report = json.loads(r.stdout or "{}") if r.returncode in (0, 1, 2) else {}
    run.record("gate: badscale must FAIL, the candidate must not FAIL",
               checks.gate_verdicts(report, "fp8kv_badscale", CANDIDATE, checks.badscale_must_fail(run.backend("tiny"))))


def eval_argv(run: Run, build_id: str, prof: Path) -> list[str]:
    return ["eval", build_id, "--suites", GATE_SUITES, "--limit", str(run.args.limit), "--replicates",
            str(run.args.replicates), "--profile", str(prof), "--port", str(run.args.port), "--trust-remote-code"]


def unknown_flags(run: Run, command: str, argv: list[str]) -> list[str]:
    """The flags of a qverify call that today's `qverify <command> --help` does not list."""
    import re

    helps = set(re.findall(r"--[a-z][a-z0-9-]*", run.qv(command, "--help").stdout))
    return [a for a in argv if a.startswith("--") and a not in helps]


def gate_argv(ids: dict[str, str]) -> list[str]:
    return ["gate", "--baseline", ids["bf16"], "--candidate", ids["fp8kv_badscale"], "--candidate", ids[CANDIDATE],
            "--suites", GATE_SUITES, "--fixed", "--no-report"]


# ----------------------------------------------------------------------------- the run


def dry_checks(run: Run, builds: dict, profiles: dict) -> None:
    """Every command the GPU run launches, parsed by SGLang; the gate call against the CLI; every check it will make."""
    for name, (model, recipe, drafter) in SERVED.items():
        sa = parse_with_sglang(command(run, builds[model][recipe]["sglang"]["build_id"], profiles[name]))
        want_kv = "fp8_e4m3" if recipe != "bf16" and recipe != "as_shipped" else "auto"
        ok = sa.kv_cache_dtype == want_kv and sa.tp_size == run.tp(model) and sa.attention_backend == run.backend(model)
        if drafter:
            ok &= sa.speculative_algorithm is not None and sa.speculative_draft_model_quantization is not None
        run.record(f"SGLang parses the {name} command", checks.Outcome("ok" if ok else "FAIL", (
            f"kv {sa.kv_cache_dtype}, tp {sa.tp_size}, attention {sa.attention_backend}, spec "
            f"{sa.speculative_algorithm}/{sa.speculative_draft_model_quantization}")))
    ids = {r: builds["tiny"][r]["sglang"]["build_id"] for r in ("bf16", "fp8kv_badscale", CANDIDATE)}
    for command_name, argv in (("eval", eval_argv(run, ids["bf16"], profiles["tiny-candidate"])), ("gate", gate_argv(ids))):
        missing = unknown_flags(run, command_name, argv)
        run.record(f"{command_name} call matches the CLI", checks.Outcome(
            "FAIL" if missing else "ok", f"qverify {shlex.join(argv)}" + (f"; unknown flags {missing}" if missing else "")))
    badscale = "must FAIL" if checks.badscale_must_fail(run.backend("tiny")) else "must not FAIL (backend ignores k_scale)"
    for name, rule in checks.PLAN:
        run.record(f"will check: {name}", checks.Outcome("plan", rule + (f" [badscale {badscale}]" if "gate" in name else "")))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="every step that needs no GPU, and the plan of checks")
    ap.add_argument("--workdir", default=os.environ.get("WORKDIR") or f"/tmp/qverify-acceptance-{os.getpid()}")
    ap.add_argument("--port", type=int, default=int(os.environ.get("PORT", "30571")))
    ap.add_argument("--tp", type=int, default=int(os.environ.get("TP", "1")), help="the kimi fixture's TP")
    ap.add_argument("--sm100", action="store_true", default=os.environ.get("SM100") == "1",
                    help="trtllm_mla (B200's default for DeepSeek/Kimi) instead of flashinfer")
    ap.add_argument("--limit", type=int, default=int(os.environ.get("LIMIT", "40")))
    ap.add_argument("--replicates", type=int, default=int(os.environ.get("REPLICATES", "1")))
    ap.add_argument("--ready-timeout", type=float, default=float(os.environ.get("READY_TIMEOUT", "900")))
    args = ap.parse_args(argv)
    run = Run(args)
    from qverify.suites.sandbox import _weak_reason, sandbox_kind

    kind = sandbox_kind()
    run.record("bubblewrap works (before anything starts)", checks.bwrap_ready(kind, _weak_reason))
    if kind != "bwrap" and not run.dry:
        return 1
    src = sources(run)
    builds: dict = {"tiny": {}, "kimi": {}}
    for model, recipes in (("tiny", TINY_RECIPES), ("kimi", KIMI_RECIPES)):
        for recipe in recipes:
            b = build(run, recipe, src[model][0])
            builds[model][recipe] = {"sglang": b, "engine": b if model == "tiny" else build(run, recipe, src[model][1])}
            run.record(f"build {model} {recipe}", checks.Outcome("ok", b["build_id"]))
    profiles = {name: profile(run, name, model, drafter) for name, (model, _, drafter) in SERVED.items()}
    from transformers import AutoTokenizer

    prompts = {m: host.prompt_ids(AutoTokenizer.from_pretrained(src[m][1], trust_remote_code=True))[: 2 if run.dry else None]
               for m in src}
    if run.dry:
        dry_checks(run, builds, profiles)
        compare(run, builds, prompts, stand_in(run, builds, prompts))  # the host side, end to end, on CPU
    else:
        compare(run, builds, prompts, serve_all(run, builds, profiles, prompts))
        gate(run, builds, profiles)
    (run.work / "acceptance.json").write_text(json.dumps(run.results, indent=2))
    failed = [r for r in run.results if r["status"] == "FAIL"]
    print(f"{'FAIL' if failed else 'ok'}: {len(run.results)} steps, {len(failed)} failed; {run.work / 'acceptance.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
