#!/usr/bin/env bash
# The GPU acceptance run on SGLang 0.5.23: a thin wrapper around benchmarks/gpu/sglang_acceptance.py, whose
# docstring lists every step and what it requires. No download: qverify-tiny ships with qverify, and the kimi_k25
# fixture (Kimi's attention shapes) is made on the host.
#
# Dry run, no GPU (CI runs it: tests/benchmarks/test_sglang_acceptance.py): the builds, every launch command parsed
# by SGLang's own prepare_server_args, the eval and gate calls checked against today's CLI, the plan of every check,
# and the host-side comparison end to end with the embedded engine standing in for SGLang:
#   bash benchmarks/gpu/sglang_smoke.sh --dry-run
# On a GPU host (SGLang's own venv is made by scripts/setup_sglang.sh):
#   bash benchmarks/gpu/sglang_smoke.sh            # one H200: flashinfer pinned (the engine does not emulate fa3)
#   TP=4 bash benchmarks/gpu/sglang_smoke.sh       # 4 x B200: trtllm_mla (SM100=1 is set on compute capability 10.x)
# Knobs: WORKDIR, PORT, LIMIT (40 gate items per suite), REPLICATES (1), READY_TIMEOUT (s, 900).
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
