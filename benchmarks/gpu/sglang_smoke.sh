#!/usr/bin/env bash
# The Kimi production path on SGLang 0.5.23: a thin wrapper around benchmarks/gpu/sglang_acceptance.py, whose
# docstring lists every step and what it asserts.
#
# Dry run, no GPU (CI runs it: tests/benchmarks/test_sglang_acceptance.py): tiny Kimi-shaped checkpoint and
# EAGLE3 head, real builds, every launch command parsed by SGLang's own prepare_server_args, capacity plan,
# the gate call's flags checked against today's CLI:
#   bash benchmarks/gpu/sglang_smoke.sh --dry-run
# On a GPU host (SGLang's own venv is made by scripts/setup_sglang.sh):
#   MODEL_DIR=/models/Moonlight-16B-A3B-Instruct [DRAFTER_DIR=/models/<eagle3-head>] bash benchmarks/gpu/sglang_smoke.sh
# Variants: SM100=1 forces --attention-backend trtllm_mla (set automatically on compute capability 10.x, i.e.
# B200); TP=4 on 4 GPUs. Knobs: WORKDIR, PORT, LIMIT (8), REPLICATES (2), READY_TIMEOUT (s, 1800).
# STATUS: the dry run passes in CI; the GPU steps have NOT run on a GPU yet (docs/serve.md, "What has run on a GPU").
set -euo pipefail

cd "$(dirname "$0")/../.."
if [ -x .venv/bin/python ]; then PY=$PWD/.venv/bin/python
elif command -v qverify >/dev/null; then PY=$(dirname "$(command -v qverify)")/python
else echo "qverify is not installed: run scripts/setup.sh first" >&2; exit 4; fi

if [[ " $* " != *" --dry-run "* ]]; then
  CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1) || { echo "no GPU visible" >&2; exit 3; }
  if [ -z "${SM100:-}" ] && [[ "$CAP" == 10.* ]]; then export SM100=1; fi
  [ -x .venv-sglang/bin/python ] || scripts/setup_sglang.sh
  export QVERIFY_SGLANG_PYTHON=${QVERIFY_SGLANG_PYTHON:-$PWD/.venv-sglang/bin/python}
fi
exec "$PY" benchmarks/gpu/sglang_acceptance.py "$@"
