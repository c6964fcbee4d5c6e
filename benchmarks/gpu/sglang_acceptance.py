"""GPU acceptance run of the Kimi production path on SGLang 0.5.23, with a --dry-run that needs no GPU.

`--dry-run` (CI runs it: tests/benchmarks/test_sglang_acceptance.py) does every step that needs no GPU, at tiny
size: builds a Kimi-shaped checkpoint and an MLA EAGLE3 head, builds `as_shipped` and the FP8-KV candidate
(with the FP8 drafter), renders every SGLang command the GPU run launches and parses each with SGLang's own
`prepare_server_args` and `SpeculativeAlgorithm.from_string`, plans capacity with `qverify capacity`, and checks
every flag of the gate call against `qverify gate --help`. A removed or renamed flag fails it.

On a GPU (MODEL_DIR = Moonlight-16B-A3B-Instruct or another DeepSeek-V3-architecture MoE, made Kimi-shaped here;
DRAFTER_DIR = an EAGLE3 head for it, optional) it asserts, each result in $WORKDIR/acceptance.json:
- the MLA k_scale SGLang loads is 1.0 (read through SGLang's own renaming and scale processing, from its source);
- greedy decode of as_shipped with --kv-cache-dtype fp8_e4m3 agrees with bf16 KV: mean common prefix of 256
  greedy tokens over 8 prompts >= FP8_PREFIX_MIN of them (stated before any run; a scale applied as trtllm_mla
  applies a wrong one breaks the sequence after its first token);
- a tool call with tool_choice "auto" (so the kimi_k2 parser, not a JSON-schema constraint, produces it);
- spec_accept_length present and > 1 with EAGLE3 (skipped, and said so, without DRAFTER_DIR);
- /server_info max_total_num_tokens within 10% of `qverify capacity` for the served build and profile;
- a short `qverify gate` ends with a verdict (exit 0, 1 or 2).
Variants: SM100=1 forces --attention-backend trtllm_mla (B200's default for DeepSeek/Kimi); TP=4 for 4 GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
FP8_PREFIX_MIN = 0.5  # of 256 greedy tokens, mean over prompts; a first threshold, not yet measured on a GPU
CAPACITY_TOLERANCE = 0.10
DECODE_TOKENS = 256
GATE = ["gate", "--recipe", "{recipe}", "--config", "{config}", "--no-report"]  # checked against `gate --help`
PROMPTS = ["Write a Python function that merges two sorted lists, then explain it.",
           "List the first twenty prime numbers and say how you found them.",
           "Explain what a hash map is to a new programmer.", "Describe the water cycle in detail.",
           "Write a short story about a lighthouse keeper.", "Summarise the rules of chess.",
           "Explain how TCP differs from UDP.", "Give a recipe for bread and explain each step."]


class Run:
    def __init__(self, args: argparse.Namespace):
        self.args, self.dry = args, args.dry_run
        self.work = Path(args.workdir)
        self.work.mkdir(parents=True, exist_ok=True)
        self.results: list[dict] = []
        self.qv_python = sys.executable

    def qv(self, *argv: str, check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess:
        cmd = [self.qv_python, "-m", "qverify", "--workdir", str(self.work / "wd"), *argv]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd or REPO, check=False)
        if check and r.returncode != 0:
            raise SystemExit(f"infrastructure: {shlex.join(cmd)} exited {r.returncode}\n{r.stderr[-3000:]}")
        return r

    def record(self, name: str, status: str, detail: str) -> None:
        self.results.append({"check": name, "status": status, "detail": detail})
        print(f"{status:5} {name}: {detail}", flush=True)

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.record(name, "ok" if ok else "FAIL", detail)


# ----------------------------------------------------------------------------- inputs and builds


def source_and_drafter(run: Run) -> tuple[Path, Path | None]:
    if run.dry:  # the Kimi-shaped fixture and an MLA EAGLE3 head, at tiny size
        from tests.fixtures.kimi_shaped import kimi_shaped_dir
        from tests.quantize.test_eagle3_fp8 import make_mla_head

        src = kimi_shaped_dir(run.work / "fixtures")
        head = run.work / "eagle3-head"
        if not (head / "config.json").is_file():
            make_mla_head(head, hidden=json.loads((src / "config.json").read_text())["hidden_size"])
        return src, head
    src = run.work / "source-int4"
    if not (src / "config.json").is_file():  # Moonlight made Kimi-shaped: routed experts INT4 W4A16 group 32
        code = ("import shutil, sys; from pathlib import Path; from tests.fixtures.kimi_shaped import "
                "_quantize_routed_experts as q; a, b = Path(sys.argv[1]), Path(sys.argv[2]); q(a, b); "
                "[shutil.copy2(p, b / p.name) for p in a.iterdir() if p.is_file() and not (b / p.name).exists() "
                "and not p.name.endswith(('.safetensors', '.safetensors.index.json'))]")  # tokenizer, templates
        subprocess.run([run.qv_python, "-c", code, os.environ["MODEL_DIR"], str(src)], check=True, cwd=REPO)
    drafter = os.environ.get("DRAFTER_DIR")
    return src, Path(drafter) if drafter else None


def build(run: Run, recipe: str, src: Path, drafter: Path | None) -> dict:
    argv = ["--json", "build", "--recipe", recipe, "--model", str(src), "--trust-remote-code"]
    argv += ["--drafter", str(drafter)] if drafter else []
    argv += ["--calib-samples", "8", "--calib-seq-len", "64"] if run.dry else []
    out = json.loads(run.qv(*argv).stdout)
    from qverify.workdir import read_build_manifest_dict

    manifest = read_build_manifest_dict(Path(out["build_dir"]))
    run.record(f"build {recipe}", "ok", f"{manifest['build_id']} (drafter: {manifest.get('drafter_kind')}, "
               f"draft quantization: {manifest.get('serving', {}).get('draft_model_quantization')})")
    return manifest


def sglang_k_scale(build_dir: Path) -> float:
    """The MLA k_scale SGLang 0.5.23 ends up with: its own renaming (only self_attn.k_proj.k_scale reaches
    attn_mqa.k_scale) and `process_weights_after_loading` (no scale loaded: 1.0), run from its source."""
    from safetensors import safe_open

    from tests.sglang_ref.sglang_source import kv_scale_remap

    remap, loaded = kv_scale_remap(), []
    params = {f"model.layers.{i}.self_attn.attn_mqa.k_scale" for i in range(512)}
    for f in sorted(build_dir.glob("*.safetensors")):
        with safe_open(f, "pt") as st:
            for name in st.keys():  # noqa: SIM118 -- safe_open has no __iter__
                if name.endswith("k_scale") and remap(name, params):
                    loaded.append(float(st.get_tensor(name).float().max()))
    return max(loaded) if loaded else 1.0


# ----------------------------------------------------------------------------- profiles and commands


def profile(run: Run, name: str, *, kv: str | None, drafter: bool) -> Path:
    extra = ["--cuda-graph-max-bs-decode", "16"]  # plain --cuda-graph-max-bs is ambiguous in 0.5.23
    if kv:
        extra += ["--kv-cache-dtype", kv]
    if run.args.sm100:  # what B200 picks for DeepSeek/Kimi anyway (arg_groups/model_overrides/deepseek_v2.py)
        extra += ["--attention-backend", "trtllm_mla"]
    flags = {"trust_remote_code": True, "mem_fraction_static": 0.8, "tool_call_parser": "kimi_k2",
             "reasoning_parser": None, "use_drafter": drafter, "enable_metrics": True, "random_seed": 0,
             "extra_args": extra}
    if drafter:
        flags |= {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
    path = run.work / f"{name}.yaml"
    path.write_text(json.dumps({"description": f"acceptance: {name}", "backend": "sglang", "tp": run.args.tp,
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
            time.sleep(3)
        self.info = json.loads(out.read_text())
        self.url = f"http://127.0.0.1:{self.run.args.port}"
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=300)

    def chat(self, **body) -> dict:
        import httpx

        body = {"model": self.build_id, "temperature": 0, **body}
        return httpx.post(self.url + "/v1/chat/completions", json=body, timeout=600).raise_for_status().json()

    def greedy_ids(self, prompt: str) -> list[int]:
        import httpx

        body = {"text": prompt, "sampling_params": {"max_new_tokens": DECODE_TOKENS, "temperature": 0,
                                                     "ignore_eos": True}}
        r = httpx.post(self.url + "/generate", json=body, timeout=600).raise_for_status().json()
        return list(r["output_ids"])


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def gpu_checks(run: Run, shipped: dict, cand: dict, profiles: dict[str, Path], drafter: bool) -> None:
    cand_dir = run.work / "wd" / "builds" / cand["build_id"]
    k = sglang_k_scale(cand_dir)
    run.check("MLA k_scale SGLang loads is 1.0", k == 1.0, f"{k:g} (a scale != 1 multiplies every trtllm_mla decode logit)")

    outputs: dict[str, list[list[int]]] = {}
    for name in ("shipped-bf16kv", "shipped-fp8kv"):
        with Served(run, shipped["build_id"], profiles[name]) as srv:
            outputs[name] = [srv.greedy_ids(p) for p in PROMPTS]
    fractions = [common_prefix(a, b) / DECODE_TOKENS for a, b in zip(outputs["shipped-bf16kv"], outputs["shipped-fp8kv"], strict=True)]
    mean = sum(fractions) / len(fractions)
    run.check("as_shipped greedy, fp8_e4m3 KV vs bf16 KV", mean >= FP8_PREFIX_MIN,
              f"mean common prefix {mean:.2f} of {DECODE_TOKENS} tokens (threshold {FP8_PREFIX_MIN}); per prompt "
              + ", ".join(f"{f:.2f}" for f in fractions))

    with Served(run, cand["build_id"], profiles["candidate"]) as srv:
        tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
        r = srv.chat(max_tokens=256, tools=[tool], tool_choice="auto",
                     messages=[{"role": "user", "content": "Use the tool: what is the weather in Paris?"}])
        calls = r["choices"][0]["message"].get("tool_calls") or []
        ok = bool(calls) and calls[0]["function"]["name"] == "get_weather" \
            and "city" in json.loads(calls[0]["function"]["arguments"] or "{}")
        run.check("tool call parsed by kimi_k2 (tool_choice auto)", ok, f"finish {r['choices'][0].get('finish_reason')}: {calls[:1]}")
        r = srv.chat(max_tokens=128, return_meta_info=True, messages=[{"role": "user", "content": PROMPTS[0]}])
        accept = (r["choices"][0].get("meta_info") or {}).get("spec_accept_length")
        if drafter:
            run.check("EAGLE3 spec_accept_length > 1", accept is not None and accept > 1, f"{accept} (choices[0].meta_info)")
        else:
            run.record("EAGLE3 spec_accept_length > 1", "SKIP", "no DRAFTER_DIR: no EAGLE3 head to serve")
        served_tokens = srv.info["info"].get("max_total_num_tokens")
    plan = capacity_plan(run, cand["build_id"], profiles["candidate"])
    planned = plan["kv_tokens_per_replica"]
    ok = served_tokens is not None and abs(served_tokens - planned) <= CAPACITY_TOLERANCE * planned
    run.check("max_total_num_tokens vs qverify capacity", ok, f"served {served_tokens}, planned {planned:,} (tolerance 10%)")

    r = run.qv("--json", *gate_argv(run, drafter), check=False, cwd=run.work)
    verdict = (json.loads(r.stdout or "{}") or {}).get("verdict") if r.returncode in (0, 1, 2) else None
    run.check("short gate ends with a verdict", verdict is not None, f"{verdict} (exit {r.returncode})")


def capacity_plan(run: Run, build_id: str, prof: Path) -> dict:
    argv = ["--json", "capacity", build_id, "--profile", str(prof)]
    argv += gpu_flags() if not run.dry else ["--gpu", "h200"]
    return json.loads(run.qv(*argv).stdout)


def gpu_flags() -> list[str]:
    """The plan's GPU: b200/h200/h100 by name, else the memory the GPU reports."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout.splitlines()[0]
    name, mib = (x.strip() for x in out.split(","))
    for key in ("b200", "h200", "h100"):
        if key in name.lower():
            return ["--gpu", key]
    return ["--gpu", "gpu", "--hbm-gb", str(int(mib) * 2**20 / 1e9)]


def gate_argv(run: Run, drafter: bool) -> list[str]:
    recipe = "fp8kv_nvfp4shared_fp8drafter" if drafter else "fp8kv_nvfp4shared"
    return [a.format(recipe=recipe, config=run.work / "qverify.toml") for a in GATE]


def write_gate_config(run: Run, src: Path, drafter: Path | None, prof: Path) -> None:
    lines = [f'model = "{src}"', "trust_remote_code = true", 'baseline = "as_shipped"',
             'suites = ["coding", "toolcall", "kld"]', f"replicates = {run.args.replicates}", f"limit = {run.args.limit}",
             "report = false", "[serving]", 'backend = "sglang"', f'profile = "{prof}"', f"port = {run.args.port}"]
    if drafter:
        lines.insert(1, f'drafter = "{drafter}"')
    (run.work / "qverify.toml").write_text("\n".join(lines) + "\n")


# ----------------------------------------------------------------------------- dry run


def dry_checks(run: Run, shipped: dict, cand: dict, profiles: dict[str, Path], drafter: bool) -> None:
    """Every command the GPU run launches, parsed by SGLang; the capacity plan; the gate call's flags."""
    builds = {"shipped-bf16kv": shipped, "shipped-fp8kv": shipped, "candidate": cand}
    for name, prof in profiles.items():
        sa = parse_with_sglang(command(run, builds[name]["build_id"], prof))
        want_kv = "auto" if name == "shipped-bf16kv" else "fp8_e4m3"
        ok = sa.kv_cache_dtype == want_kv and sa.tp_size == run.args.tp and sa.tool_call_parser == "kimi_k2"
        ok &= (sa.attention_backend == "trtllm_mla") if run.args.sm100 else True
        if name == "candidate" and drafter:
            ok &= sa.speculative_algorithm == "EAGLE3" and sa.speculative_draft_model_quantization == "compressed-tensors"
        run.check(f"SGLang parses the {name} command", ok,
                  f"kv {sa.kv_cache_dtype}, tp {sa.tp_size}, attention {sa.attention_backend}, spec "
                  f"{sa.speculative_algorithm}/{sa.speculative_draft_model_quantization}")
    k = sglang_k_scale(run.work / "wd" / "builds" / cand["build_id"])
    run.record("MLA k_scale SGLang would load", "info", f"{k:g} (the GPU run asserts 1.0)")
    plan = capacity_plan(run, cand["build_id"], profiles["candidate"])
    run.check("qverify capacity plans the served build", plan["kv_tokens_per_replica"] > 0 and plan["tp"] == run.args.tp,
              f"{plan['kv_tokens_per_replica']:,} tokens at mem_fraction {plan['mem_fraction']} ({plan['mem_fraction_source']})")
    missing = unknown_gate_flags(run, drafter)
    from qverify.config import load_config

    load_config(run.work / "qverify.toml")  # the gate's config parses under today's schema
    run.check("gate call matches the CLI", not missing, f"qverify {shlex.join(gate_argv(run, drafter))}"
              + (f"; unknown flags {missing}" if missing else ""))


def unknown_gate_flags(run: Run, drafter: bool) -> list[str]:
    """The gate call's flags that today's `qverify gate --help` does not list."""
    helps = set(re.findall(r"--[a-z][a-z0-9-]*", run.qv("gate", "--help").stdout))
    return [a for a in gate_argv(run, drafter) if a.startswith("--") and a not in helps]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="every step that needs no GPU, at tiny size")
    ap.add_argument("--workdir", default=os.environ.get("WORKDIR") or f"/tmp/qverify-acceptance-{os.getpid()}")
    ap.add_argument("--port", type=int, default=int(os.environ.get("PORT", "30571")))
    ap.add_argument("--tp", type=int, default=int(os.environ.get("TP", "1")))
    ap.add_argument("--sm100", action="store_true", default=os.environ.get("SM100") == "1",
                    help="force --attention-backend trtllm_mla (B200's default for DeepSeek/Kimi)")
    ap.add_argument("--limit", type=int, default=int(os.environ.get("LIMIT", "8")))
    ap.add_argument("--replicates", type=int, default=int(os.environ.get("REPLICATES", "2")))
    ap.add_argument("--ready-timeout", type=float, default=float(os.environ.get("READY_TIMEOUT", "1800")))
    args = ap.parse_args(argv)
    run = Run(args)
    if not run.dry and not os.environ.get("MODEL_DIR"):
        print("set MODEL_DIR to a local Moonlight-16B-A3B-Instruct (or pass --dry-run)", file=sys.stderr)
        return 4
    src, drafter = source_and_drafter(run)
    shipped = build(run, "as_shipped", src, drafter)
    cand = build(run, "fp8kv_nvfp4shared_fp8drafter" if drafter else "fp8kv_nvfp4shared", src, drafter)
    has_head = cand.get("drafter_kind") == "eagle3"
    profiles = {"shipped-bf16kv": profile(run, "shipped-bf16kv", kv=None, drafter=False),
                "shipped-fp8kv": profile(run, "shipped-fp8kv", kv="fp8_e4m3", drafter=False),
                "candidate": profile(run, "candidate", kv=None, drafter=has_head)}
    write_gate_config(run, src, drafter, profiles["candidate"])
    (dry_checks if run.dry else gpu_checks)(run, shipped, cand, profiles, has_head)
    (run.work / "acceptance.json").write_text(json.dumps(run.results, indent=2))
    failed = [r for r in run.results if r["status"] == "FAIL"]
    print(f"{'FAIL' if failed else 'ok'}: {len(run.results)} steps, {len(failed)} failed; {run.work / 'acceptance.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
