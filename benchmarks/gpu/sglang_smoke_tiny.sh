#!/usr/bin/env bash
# SGLang smoke on one GPU (sized for <= 8 minutes on one H200):
#   1. install SGLang 0.5.23 into its own venv (.venv-sglang; it pins transformers 5.19, qverify 5.15-5.17),
#   2. build qverify-tiny with the full production recipe fp8kv_nvfp4shared_fp8drafter,
#   3. `qverify serve --backend sglang --profile h200-tp1` (TP1, fp8_e4m3 KV, compressed-tensors, FP8 drafter
#      as STANDALONE speculative decoding) -- the profile is h200-tp1 with `python` pointed at that venv,
#   4. every suite at low counts through `qverify eval --backend endpoint`,
#   5. prints readiness time, KV capacity, per-request and average accept length, and the scores.
#
# Run from the repository root, with qverify installed in .venv (scripts/setup.sh) or on PATH:
#   bash benchmarks/gpu/sglang_smoke_tiny.sh   (the Kimi-shaped production path: benchmarks/gpu/sglang_smoke.sh)
# Knobs (environment): WORKDIR, PORT, LIMIT (items per suite, 8), SUITES, SGLANG_VERSION, SGLANG_VENV,
# READY_TIMEOUT (s). pip honours PIP_INDEX_URL / PIP_FIND_LINKS / PIP_NO_INDEX for an offline mirror.
# On H200 (SM90) SGLang serves the NVFP4 shared experts weight-only (FP4 Marlin): it warns that W4A4
# needs SM100, so activations stay bf16 there; the numerics match B200 only for the weights.
set -euo pipefail

cd "$(dirname "$0")/../.."
T0=$(date +%s)
WORKDIR=${WORKDIR:-$(mktemp -d /tmp/qverify-smoke.XXXX)}
PORT=${PORT:-30571}
LIMIT=${LIMIT:-8}
SUITES=${SUITES:-coding toolcall longctx verifier kld}
RECIPE=fp8kv_nvfp4shared_fp8drafter
SGLANG_VERSION=${SGLANG_VERSION:-0.5.23}
SGLANG_VENV=${SGLANG_VENV:-$PWD/.venv-sglang}
READY_TIMEOUT=${READY_TIMEOUT:-300}
stamp() { printf '[%4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }

if [ -x .venv/bin/qverify ]; then QV=.venv/bin/qverify; PY=.venv/bin/python
elif command -v qverify >/dev/null; then QV=qverify; PY=$(dirname "$(command -v qverify)")/python
else echo "qverify is not installed: run scripts/setup.sh (or pip install -e .) first" >&2; exit 4; fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { echo "no GPU visible" >&2; exit 3; }

# ---------------------------------------------------------------- 1. SGLang in its own venv
if ! "$SGLANG_VENV/bin/python" -c "import sglang, sys; sys.exit(sglang.__version__ != '$SGLANG_VERSION')" 2>/dev/null; then
  stamp "installing sglang==$SGLANG_VERSION into $SGLANG_VENV"
  if command -v uv >/dev/null; then
    uv venv -q "$SGLANG_VENV" && VIRTUAL_ENV=$SGLANG_VENV uv pip install -q "sglang==$SGLANG_VERSION"
  else
    python3 -m venv "$SGLANG_VENV" && "$SGLANG_VENV/bin/pip" install -q "sglang==$SGLANG_VERSION"
  fi
fi
stamp "sglang $("$SGLANG_VENV/bin/python" -c 'import sglang; print(sglang.__version__)')"

# ---------------------------------------------------------------- 2. the build
stamp "building qverify-tiny with $RECIPE"
"$QV" --workdir "$WORKDIR" build --recipe "$RECIPE" >"$WORKDIR/build.out" 2>&1 || { tail -20 "$WORKDIR/build.out"; exit 3; }
BUILD=$("$PY" - "$WORKDIR" "$RECIPE" <<'EOF'
import json, sys, pathlib
rows = [json.loads(p.read_text()) for p in pathlib.Path(sys.argv[1], "builds").glob("*/build.json")]
print(max((r for r in rows if r["recipe"] == sys.argv[2]), key=lambda r: r["created"])["build_id"])
EOF
)
stamp "build $BUILD"

# ---------------------------------------------------------------- 3. serve with SGLang
PROFILE=$WORKDIR/h200-tp1-smoke.yaml
{ sed '/^flags:/q' qverify/serve/profiles/h200-tp1.yaml
  echo "  python: $SGLANG_VENV/bin/python"
  sed '1,/^flags:/d' qverify/serve/profiles/h200-tp1.yaml; } >"$PROFILE"
"$QV" --workdir "$WORKDIR" serve "$BUILD" --profile "$PROFILE" --port "$PORT" --dry-run | sed 's/^/  $ /'

"$QV" --workdir "$WORKDIR" --json serve "$BUILD" --profile "$PROFILE" --port "$PORT" --ready-timeout "$READY_TIMEOUT" \
  >"$WORKDIR/serve.json" 2>"$WORKDIR/serve.err" &
SERVE_PID=$!
cleanup() {
  # SIGTERM, not SIGINT: a script's background job ignores SIGINT; qverify serve stops on either
  if kill -0 "$SERVE_PID" 2>/dev/null; then kill -TERM "$SERVE_PID"; wait "$SERVE_PID" || true; fi
  stamp "server stopped; logs in $WORKDIR/logs"
}
trap cleanup EXIT
until grep -q '^}' "$WORKDIR/serve.json" 2>/dev/null; do
  if ! kill -0 "$SERVE_PID" 2>/dev/null; then
    echo "serve failed:" >&2; cat "$WORKDIR/serve.err" >&2
    tail -50 "$(ls -t "$WORKDIR"/logs/sglang-*.log | head -1)" >&2 || true
    exit 3
  fi
  sleep 2
done
"$PY" - "$WORKDIR/serve.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
i = d["info"]
print(f"READY {d['ready_s']}s  endpoint {d['endpoint']}  model {d['model']}")
print(f"  max_total_num_tokens {i.get('max_total_num_tokens')}  kv {i.get('kv_cache_dtype')}  "
      f"quant {i.get('quantization')}  spec {i.get('speculative_algorithm')} "
      f"({i.get('speculative_num_steps')}/{i.get('speculative_eagle_topk')}/{i.get('speculative_num_draft_tokens')})  "
      f"attention {i.get('attention_backend')}")
EOF
URL=http://127.0.0.1:$PORT

# one request with per-request meta_info (SGLang's return_meta_info)
"$PY" - "$URL" "$BUILD" <<'EOF' || echo "  the meta_info request failed"
import sys, httpx
from qverify.serve.endpoint import spec_meta, with_meta_info
body = with_meta_info({"model": sys.argv[2], "max_tokens": 64, "temperature": 0,
                       "messages": [{"role": "user", "content": "Write a Python function add(a, b)."}]})
r = httpx.post(sys.argv[1] + "/v1/chat/completions", json=body, timeout=120).json()
print("per-request meta_info:", spec_meta(r))
EOF

# ---------------------------------------------------------------- 4. the suites
for suite in $SUITES; do
  stamp "eval $suite (limit $LIMIT, 1 replicate)"
  "$QV" --workdir "$WORKDIR" --json eval "$BUILD" --suites "$suite" --backend endpoint --endpoint "$URL" \
    --limit "$LIMIT" --replicates 1 --concurrency 8 >"$WORKDIR/eval-$suite.json" 2>"$WORKDIR/eval-$suite.err" \
    || { echo "  eval $suite FAILED:"; tail -5 "$WORKDIR/eval-$suite.err"; continue; }
  "$PY" - "$WORKDIR/eval-$suite.json" <<'EOF' || cat "$WORKDIR/eval-$suite.json"
import json, sys
for s in json.load(open(sys.argv[1])):
    fmt = lambda v, f: "-" if v is None else format(v, f)
    print(f"  SCORE {s['suite']:<9} {s['metric']:<24} {fmt(s['mean'], '.3f')}  errors {s['errors']}/{s['results']}  "
          f"tok/s/req {fmt(s.get('tokens_per_s'), '.0f')}  accept {fmt(s.get('accept_length'), '.2f')}")
EOF
done

# ---------------------------------------------------------------- 5. server-side accept length after the traffic
"$PY" - "$URL" <<'EOF' || true
import sys
from qverify.serve.endpoint import fetch_server_info, summarize_info
i = summarize_info(fetch_server_info(sys.argv[1], {}, []))
print(f"ACCEPT avg_spec_accept_length {i.get('avg_spec_accept_length')}  (internal_states[0], after the suites)")
EOF
stamp "done (budget 480 s)"
