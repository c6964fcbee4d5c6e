#!/usr/bin/env bash
# The Kimi production path end to end on one GPU, with a small real DeepSeek-V3-architecture MoE:
# Moonlight-16B-A3B-Instruct (MLA 512/64, 64 routed + 2 shared experts, Kimi's remote-code tiktoken tokenizer).
#   1. SGLang 0.5.23 in its own venv (scripts/setup_sglang.sh -> .venv-sglang),
#   2. make it Kimi-shaped: routed experts INT4 W4A16 pack-quantized group 32 with llm-compressor (on the GPU),
#      exactly as Kimi K2.x ships them (tests/fixtures/kimi_shaped.py's scheme),
#   3. build `as_shipped` and `fp8kv_nvfp4shared` from it (--trust-remote-code; INT4 experts kept byte for byte),
#   4. serve the candidate with SGLang and the production flags (TP1, --trust-remote-code, fp8_e4m3 KV,
#      compressed-tensors, kimi_k2 tool parser, NGRAM speculative decoding since Moonlight has no EAGLE3 head),
#   5. KV-scale check: SGLang's log must not report `attn_mqa.k_scale` missing (the scale qverify writes under
#      self_attn.k_proj.k_scale is the one SGLang loads; compressed-tensors' own self_attn.k_scale/v_scale are
#      expected to be reported as skipped),
#   6. one request with per-request meta_info (spec_accept_length inside choices[0]),
#   7. a forced tool call (tool_choice naming the function) parsed by SGLang's kimi_k2 detector,
#   8. a short `qverify gate --recipe fp8kv_nvfp4shared` against `as_shipped`, both served by SGLang.
#
# Runnable on any GPU host with SGLang's requirements installable and the weights staged locally:
#   MODEL_DIR=/models/Moonlight-16B-A3B-Instruct bash benchmarks/gpu/sglang_smoke.sh
# Knobs: WORKDIR, PORT, LIMIT (items per suite, 8), REPLICATES (2), READY_TIMEOUT (s, 900), TP (1).
# On H200 (SM90) SGLang runs NVFP4 shared experts weight-only (FP4 Marlin); W4A4 needs SM100 (B200).
# STATUS: written against SGLang 0.5.23's code and the CPU tests; NOT run on a GPU yet (no GPU was lent).
set -euo pipefail

cd "$(dirname "$0")/../.."
T0=$(date +%s)
: "${MODEL_DIR:?set MODEL_DIR to a local Moonlight-16B-A3B-Instruct (or another DeepSeek-V3-architecture MoE)}"
WORKDIR=${WORKDIR:-$(mktemp -d /tmp/qverify-kimi-smoke.XXXX)}
PORT=${PORT:-30571}
LIMIT=${LIMIT:-8}
REPLICATES=${REPLICATES:-2}
READY_TIMEOUT=${READY_TIMEOUT:-900}
TP=${TP:-1}
stamp() { printf '[%4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }

if [ -x .venv/bin/qverify ]; then QV=$PWD/.venv/bin/qverify; PY=$PWD/.venv/bin/python
elif command -v qverify >/dev/null; then QV=qverify; PY=$(dirname "$(command -v qverify)")/python
else echo "qverify is not installed: run scripts/setup.sh first" >&2; exit 4; fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { echo "no GPU visible" >&2; exit 3; }

# ---------------------------------------------------------------- 1. SGLang in its own venv
[ -x .venv-sglang/bin/python ] || scripts/setup_sglang.sh
export QVERIFY_SGLANG_PYTHON=$PWD/.venv-sglang/bin/python
stamp "sglang $("$QVERIFY_SGLANG_PYTHON" -c 'import sglang; print(sglang.__version__)')"

# ---------------------------------------------------------------- 2. Kimi-shaped source (INT4 routed experts)
SOURCE=$WORKDIR/source-int4
if [ ! -f "$SOURCE/config.json" ]; then
  stamp "quantizing routed experts to INT4 W4A16 group 32 (llm-compressor, on the GPU)"
  "$PY" - "$MODEL_DIR" "$SOURCE" <<'EOF'
import shutil, sys
from pathlib import Path
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier
from transformers import AutoModelForCausalLM
sys.path.insert(0, ".")
from tests.fixtures.kimi_shaped import KIMI_ROUTED_INT4  # the scheme Kimi ships, one place
src, out = Path(sys.argv[1]), Path(sys.argv[2])
model = AutoModelForCausalLM.from_pretrained(src, dtype="auto")  # native DeepSeek-V3 (what llm-compressor linearizes)
oneshot(model=model, recipe=QuantizationModifier(**KIMI_ROUTED_INT4))
model.save_pretrained(out, save_compressed=True)
(out / "recipe.yaml").unlink(missing_ok=True)
for p in src.iterdir():  # tokenizer (tiktoken.model, tokenization_moonshot.py), templates, README
    if p.is_file() and not p.name.endswith((".safetensors", ".safetensors.index.json")) and not (out / p.name).exists():
        shutil.copy2(p, out / p.name)
EOF
fi

# ---------------------------------------------------------------- 3. profile + config, then the gate builds both
PROFILE=$WORKDIR/moonlight-h200.yaml
cat >"$PROFILE" <<EOF
description: Kimi-shaped Moonlight on one GPU with the production flags (smoke).
backend: sglang
tp: $TP
max_tokens: {coding: 512, toolcall: 256, longctx: 128, verifier: 512, greedy: 256}
flags:
  trust_remote_code: true
  mem_fraction_static: 0.8
  tool_call_parser: kimi_k2
  reasoning_parser: null
  use_drafter: false
  enable_metrics: true
  extra_args: [--speculative-algorithm, NGRAM, --cuda-graph-max-bs, '16']
EOF
cat >"$WORKDIR/qverify.toml" <<EOF
model = "$SOURCE"
trust_remote_code = true
baseline = "as_shipped"
suites = ["coding", "toolcall", "kld"]
replicates = $REPLICATES
limit = $LIMIT
report = false
[serving]
backend = "sglang"
profile = "$PROFILE"
port = $PORT
EOF
for r in as_shipped fp8kv_nvfp4shared; do
  stamp "build $r"
  "$QV" --workdir "$WORKDIR/wd" --json build --recipe "$r" --model "$SOURCE" --trust-remote-code \
    >"$WORKDIR/build-$r.json" 2>"$WORKDIR/build-$r.err" || { tail -20 "$WORKDIR/build-$r.err"; exit 3; }
done
BUILD=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['build_id'])" "$WORKDIR/build-fp8kv_nvfp4shared.json")
"$PY" - "$SOURCE" "$WORKDIR/wd/builds/$BUILD" <<'EOF'
import sys
from pathlib import Path
from qverify.quantize.manifest import hash_dir
src, out = (Path(p) for p in sys.argv[1:])
strip = lambda d: {k.split("::", 1)[1]: v for k, v in hash_dir(d, tensors_only=True).items() if ".mlp.experts." in k}
s, b = strip(src), strip(out)
same = sum(b.get(k) == v for k, v in s.items())
print(f"INT4 EXPERTS kept byte for byte: {same}/{len(s)} tensors")
sys.exit(0 if same == len(s) else 1)
EOF

# ---------------------------------------------------------------- 4. serve the candidate
"$QV" --workdir "$WORKDIR/wd" serve "$BUILD" --profile "$PROFILE" --port "$PORT" --dry-run | sed 's/^/  $ /'
"$QV" --workdir "$WORKDIR/wd" --json serve "$BUILD" --profile "$PROFILE" --port "$PORT" --ready-timeout "$READY_TIMEOUT" \
  >"$WORKDIR/serve.json" 2>"$WORKDIR/serve.err" &
SERVE_PID=$!
cleanup() { if kill -0 "$SERVE_PID" 2>/dev/null; then kill -TERM "$SERVE_PID"; wait "$SERVE_PID" || true; fi; }
trap cleanup EXIT
until grep -q '^}' "$WORKDIR/serve.json" 2>/dev/null; do
  kill -0 "$SERVE_PID" 2>/dev/null || { cat "$WORKDIR/serve.err" >&2; exit 3; }
  sleep 3
done
stamp "ready: $("$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['ready_s'], 's', d['info'].get('kv_cache_dtype'))" "$WORKDIR/serve.json")"
URL=http://127.0.0.1:$PORT
LOG=$(ls -t "$WORKDIR"/wd/logs/sglang-*.log | head -1)

# ---------------------------------------------------------------- 5. KV scale reached the MLA attention
if grep -q "attn_mqa.k_scale not found" "$LOG"; then echo "KV SCALE: FAIL (SGLang did not load it)"; exit 1; fi
echo "KV SCALE: ok (no 'attn_mqa.k_scale not found'); skipped names: $(grep -c 'self_attn.[kv]_scale not found' "$LOG" || true)"

# ---------------------------------------------------------------- 6 + 7. per-request accept length, forced tool call
"$PY" - "$URL" "$BUILD" <<'EOF'
import json, sys, httpx
url, model = sys.argv[1] + "/v1/chat/completions", sys.argv[2]
r = httpx.post(url, timeout=300, json={"model": model, "max_tokens": 128, "temperature": 0, "return_meta_info": True,
               "messages": [{"role": "user", "content": "Write a Python function add(a, b) and repeat it twice."}]}).json()
meta = r["choices"][0].get("meta_info") or {}
print(f"ACCEPT per-request spec_accept_length {meta.get('spec_accept_length')} (choices[0].meta_info)")
tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
r = httpx.post(url, timeout=300, json={"model": model, "max_tokens": 128, "temperature": 0, "tools": [tool],
               "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
               "messages": [{"role": "user", "content": "What is the weather in Paris?"}]}).json()
calls = r["choices"][0]["message"].get("tool_calls") or []
ok = bool(calls) and calls[0]["function"]["name"] == "get_weather" and "city" in json.loads(calls[0]["function"]["arguments"])
print(f"TOOL CALL forced: {'ok' if ok else 'FAIL'} {calls[:1]}")
sys.exit(0 if ok else 1)
EOF
cleanup; trap - EXIT

# ---------------------------------------------------------------- 8. a short gate (SGLang serves both builds)
stamp "gate fp8kv_nvfp4shared vs as_shipped (limit $LIMIT x $REPLICATES replicates)"
set +e
(cd "$WORKDIR" && "$QV" --workdir "$WORKDIR/wd" --json gate --recipe fp8kv_nvfp4shared --n-boot 500) \
  >"$WORKDIR/gate.json" 2>"$WORKDIR/gate.err"
CODE=$?
set -e
"$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print('GATE', d['verdict'], 'exit', sys.argv[2])" "$WORKDIR/gate.json" "$CODE" \
  || { tail -20 "$WORKDIR/gate.err"; exit 3; }
stamp "done; everything under $WORKDIR"
