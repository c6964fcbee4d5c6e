"""Every SGLang command qverify generates must parse with SGLang 0.5.23's own parser.

`prepare_server_args` (SGLang's `ServerArgs.add_cli_args` -> `parse_args` -> `ServerArgs.from_cli_args`,
exactly what `python -m sglang.launch_server` runs first) checks every flag name, type and choice (kv-cache dtype, quantization, tool-call and reasoning parsers);
`SpeculativeAlgorithm.from_string` checks the algorithm name, which argparse does not.

Not run here: SGLang's full resolution (`resolve_once`), which imports torchvision and reads
the checkpoint and the GPU. benchmarks/gpu/sglang_smoke.sh launches the real command on a GPU.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qverify.errors import BadInput
from qverify.models import BuildManifest
from qverify.serve import get_backend
from qverify.serve.profile import builtin_profiles, load_profile, parse_profile

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-qverify-test-0123456789"

# What each built-in recipe implies for serving (issue 5); used only if qverify.quantize cannot be imported.
RECIPE_SERVING: dict[str, dict] = {
    "bf16": {"kv_cache_dtype": "auto"},
    "fp8kv": {"kv_cache_dtype": "fp8_e4m3"},
    "nvfp4shared": {"weight_quantization": "compressed-tensors"},
    "fp8kv_nvfp4shared": {"kv_cache_dtype": "fp8_e4m3", "weight_quantization": "compressed-tensors"},
    "fp8drafter": {"draft_model_quantization": "compressed-tensors", "requires_drafter": True},
    "fp8kv_nvfp4shared_fp8drafter": {"kv_cache_dtype": "fp8_e4m3", "weight_quantization": "compressed-tensors",
                                     "draft_model_quantization": "compressed-tensors", "requires_drafter": True},
    "nvfp4_all": {"weight_quantization": "compressed-tensors"},
}


def recipe_servings() -> dict[str, dict]:
    """Every built-in recipe's own `serving` block, as `qverify build` records it in build.json."""
    try:
        from qverify.quantize import list_recipes
    except ImportError:  # the recipes module is optional for this test
        return dict(RECIPE_SERVING)
    found = {r.recipe.name: r.recipe.serving.model_dump(mode="json") for r in list_recipes()}
    assert set(RECIPE_SERVING) <= set(found), "a built-in recipe of issue 5 is missing"
    return found


SERVINGS = recipe_servings()
SGLANG_PROFILES = [n for n, p in builtin_profiles().items() if load_profile(n).backend == "sglang"]


@pytest.fixture(scope="module")
def sglang_parser():
    """SGLang's own entry: `prepare_server_args` is what `python -m sglang.launch_server` runs first."""
    pytest.importorskip("sglang", reason="install with: pip install --no-deps sglang==0.5.23 (+ light deps, triton)")
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    def parse(argv: list[str]):
        i = argv.index("sglang.launch_server")
        assert argv[i - 1] == "-m", argv
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                sa = prepare_server_args(argv[i + 1:])  # add_cli_args -> parse_args -> from_cli_args
        except SystemExit:
            raise AssertionError(f"SGLang rejects the command: {err.getvalue().strip().splitlines()[-1]}\n{argv}") from None
        SpeculativeAlgorithm.from_string(sa.speculative_algorithm)  # names are only checked here
        return sa

    return parse


def make_build(root: Path, name: str, serving: dict, drafter: bool) -> tuple[Path, BuildManifest]:
    d = root / name.replace(":", "_") / ("with-drafter" if drafter else "no-drafter")
    (d / "drafter").mkdir(parents=True, exist_ok=True) if drafter else d.mkdir(parents=True, exist_ok=True)
    if drafter:  # qverify-tiny's drafter is a separate small DeepSeek-V3 model
        (d / "drafter" / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"]}))
    m = BuildManifest(build_id=f"b-{name.replace(':', '_')}", recipe=name, recipe_hash="h", recipe_text="",
                      source_model="qverify-tiny", source_hash="s", serving=serving,
                      kv_dtype="fp8_e4m3" if serving.get("kv_cache_dtype") == "fp8_e4m3" else "float32")
    (d / "build.json").write_text(m.model_dump_json())
    return d, m


def backend(build_dir: Path, manifest: BuildManifest, profile, tmp: Path, port: int = 30123, trust_remote_code: bool = False):
    return get_backend("sglang")(build_dir, manifest, profile, tmp / "logs", port=port, trust_remote_code=trust_remote_code)


# builds of the default model carry its drafter; a recipe that quantizes the drafter always has one
CASES = [(r, d) for r in sorted(SERVINGS) for d in (True, False) if d or not SERVINGS[r].get("requires_drafter")]


@pytest.mark.parametrize("profile_name", SGLANG_PROFILES)
@pytest.mark.parametrize("recipe, drafter", CASES, ids=[f"{r}-{'drafter' if d else 'no-drafter'}" for r, d in CASES])
def test_recipe_x_profile_parses(sglang_parser, tmp_path, recipe, profile_name, drafter):
    serving = SERVINGS[recipe]
    prof = load_profile(profile_name)
    build_dir, manifest = make_build(tmp_path, recipe, serving, drafter)
    b = backend(build_dir, manifest, prof, tmp_path)
    argv = b.node_commands(secret=KEY)[0]
    sa = sglang_parser(argv)

    assert sa.model_path == str(build_dir) and sa.served_model_name == manifest.build_id
    assert sa.tp_size == prof.tp and sa.port == 30123
    assert sa.kv_cache_dtype == ("fp8_e4m3" if serving.get("kv_cache_dtype") == "fp8_e4m3" else "auto")
    assert sa.quantization == serving.get("weight_quantization")
    assert sa.tool_call_parser == prof.flags["tool_call_parser"] == "kimi_k2"
    assert sa.reasoning_parser == prof.flags["reasoning_parser"]
    assert sa.enable_metrics and sa.mem_fraction_static == prof.flags["mem_fraction_static"]
    assert sa.enable_hierarchical_cache == prof.flags["enable_hierarchical_cache"]
    if sa.enable_hierarchical_cache:
        assert sa.hicache_ratio == prof.flags["hicache_ratio"]
    assert sa.api_key == (KEY if prof.api_key_env else None)
    if drafter:
        assert sa.speculative_algorithm == "STANDALONE"
        assert sa.speculative_draft_model_path == str(build_dir / "drafter")
        assert (sa.speculative_num_steps, sa.speculative_eagle_topk, sa.speculative_num_draft_tokens) == (3, 1, 4)
        # a bf16 drafter next to a quantized target must opt out of the target's quantization
        want = serving.get("draft_model_quantization") or ("unquant" if serving.get("weight_quantization") else None)
        assert sa.speculative_draft_model_quantization == want
    else:
        assert sa.speculative_algorithm is None and sa.speculative_draft_model_path is None
    # what is recorded never holds the key, and names the variable instead
    recorded = " ".join(b.redacted_command()) + " ".join(b.shell_lines())
    assert KEY not in recorded
    if prof.api_key_env:
        assert f"${{{prof.api_key_env}}}" in recorded


def test_b200_tp4_is_the_production_layout():
    p = load_profile("b200-tp4")
    assert p.backend == "sglang" and p.tp == 4 and p.api_key_env
    f = p.flags
    assert f["enable_hierarchical_cache"] and f["hicache_ratio"] and f["tool_call_parser"] == "kimi_k2"
    assert f["reasoning_parser"] and f["enable_metrics"] and f["context_length"] and f["mem_fraction_static"]


def test_options_deterministic_seed_and_eagle_head(sglang_parser, tmp_path):
    prof = parse_profile("""
backend: sglang
tp: 2
flags:
  enable_deterministic_inference: true
  random_seed: 1234
  speculative_num_steps: 5
  speculative_eagle_topk: 4
  speculative_num_draft_tokens: 8
  extra_args: ["--attention-backend", "fa3"]
""")
    build_dir, manifest = make_build(tmp_path, "fp8kv", RECIPE_SERVING["fp8kv"], drafter=True)
    (build_dir / "drafter" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    sa = sglang_parser(backend(build_dir, manifest, prof, tmp_path).node_commands(secret="")[0])
    assert sa.enable_deterministic_inference and sa.random_seed == 1234
    assert sa.speculative_algorithm == "EAGLE3" and sa.speculative_eagle_topk == 4
    assert sa.attention_backend == "fa3"


def test_multi_node_with_launcher_prefix(sglang_parser, tmp_path):
    prof = parse_profile("""
backend: sglang
tp: 8
api_key_env: QV_KEY
command_prefix: "srun --nodes=1 --ntasks=1 --relative={node_rank} {cmd}"
flags:
  python: python3
  host: 0.0.0.0
  nnodes: 2
  dist_init_addr: 10.1.2.3:5000
""")
    build_dir, manifest = make_build(tmp_path, "fp8kv_nvfp4shared", RECIPE_SERVING["fp8kv_nvfp4shared"], drafter=False)
    b = backend(build_dir, manifest, prof, tmp_path)
    cmds = b.node_commands(secret=KEY)
    assert len(cmds) == 2
    for rank, argv in enumerate(cmds):
        assert argv[:4] == ["srun", "--nodes=1", "--ntasks=1", f"--relative={rank}"]
        sa = sglang_parser(argv)
        assert (sa.nnodes, sa.node_rank, sa.dist_init_addr, sa.tp_size) == (2, rank, "10.1.2.3:5000", 8)
    assert b.root_url == "http://10.1.2.3:30123"  # clients reach node 0
    assert KEY not in " ".join(b.redacted_command())


def test_the_validator_can_fail(sglang_parser, tmp_path):
    """The harness must reject what SGLang rejects: an unknown flag, and an unknown algorithm."""
    build_dir, manifest = make_build(tmp_path, "bf16", {}, drafter=True)
    bad_flag = parse_profile("backend: sglang\nflags: {extra_args: ['--no-such-flag']}")
    with pytest.raises(AssertionError, match="rejects"):
        sglang_parser(backend(build_dir, manifest, bad_flag, tmp_path).node_commands(secret="")[0])
    bad_choice = parse_profile("backend: sglang\nflags: {tool_call_parser: kimi_k9}")
    with pytest.raises(AssertionError, match="rejects"):
        sglang_parser(backend(build_dir, manifest, bad_choice, tmp_path).node_commands(secret="")[0])
    bad_algo = parse_profile("backend: sglang\nflags: {speculative_algorithm: EAGLE4}")
    with pytest.raises(ValueError, match="Unknown speculative algorithm"):
        sglang_parser(backend(build_dir, manifest, bad_algo, tmp_path).node_commands(secret="")[0])


@pytest.mark.parametrize("text, message", [
    ("backend: sglang\nflags: {mem_fraction: 0.8}", "unknown key 'flags.mem_fraction'"),
    ("backend: sglang\ntp: four", "tp:"),
    ("backend: sglang\nflags: {hicache_ratio: 2.0}", "enable_hierarchical_cache"),
    ("backend: sglang\nflags: {speculative_num_steps: 3}", "or none of them"),
    ("backend: sglang\nflags: {speculative_num_steps: 3, speculative_eagle_topk: 1, speculative_num_draft_tokens: 3}",
     "must be speculative_num_steps + 1"),
    ("backend: sglang\nflags: {nnodes: 2}", "dist_init_addr"),
    ("backend: sglang\nflags: {extra_args: ['--api-key=abc']}", "never put an API key"),
    ("backend: sglang\ncommand_prefix: 'ssh node{rank} {cmd}'", "unknown placeholder {rank}"),
    ("backend: local\nflags: {tp_size: 2}", "unknown key 'flags.tp_size'"),
    ("backend: sglang\ncolour: red", "unknown key 'colour'"),
    ("backend: [sglang", "malformed YAML"),
])
def test_invalid_profiles_are_one_line_bad_input(text, message):
    with pytest.raises(BadInput) as e:
        parse_profile(text, source="p.yaml")
    assert message in str(e.value) and "\n" not in e.value.one_line()


def _cli(workdir: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qverify", "--workdir", str(workdir), *args], capture_output=True, check=False,
                          text=True, cwd=REPO, timeout=120, env={**os.environ, **(env or {})})


def test_cli_dry_run_prints_the_exact_command(sglang_parser, tmp_path):
    build_dir, _manifest = make_build(tmp_path / "builds", "x", RECIPE_SERVING["fp8kv_nvfp4shared_fp8drafter"], True)
    r = _cli(tmp_path, "serve", str(build_dir), "--backend", "sglang", "--profile", "b200-tp4", "--port", "31999",
             "--dry-run", env={"QVERIFY_API_KEY": KEY})
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip()
    assert '--api-key "${QVERIFY_API_KEY}"' in line and KEY not in line
    import shlex

    argv = [a.replace("${QVERIFY_API_KEY}", KEY) for a in shlex.split(line)]
    sa = sglang_parser(argv)
    assert sa.port == 31999 and sa.kv_cache_dtype == "fp8_e4m3" and sa.api_key == KEY


def test_cli_bad_input_exits_4(tmp_path):
    build_dir, _ = make_build(tmp_path / "builds", "x", {}, False)
    for args, msg in [(["serve", "nope", "--dry-run"], "no build 'nope'"),
                      (["serve", str(build_dir), "--profile", "b200-tp5", "--dry-run"], "did you mean 'b200-tp4'"),
                      (["serve", str(build_dir), "--profile", str(tmp_path / "missing.yaml")], "not found")]:
        r = _cli(tmp_path, *args)
        assert r.returncode == 4 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
