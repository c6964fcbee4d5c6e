#!/usr/bin/env bash
# SGLang beside qverify, in its own virtualenv (.venv-sglang): sglang 0.5.23 pins torch 2.14.1 and transformers 5.19,
# qverify's environment pins torch 2.13 / transformers 5.17, so they cannot share one. qverify launches SGLang with
# .venv-sglang/bin/python (found automatically in the working directory; or set $QVERIFY_SGLANG_PYTHON, or
# `flags.python` in a serving profile). Run on the GPU host, from the repository root:
#   scripts/setup_sglang.sh            # make/update .venv-sglang
#   scripts/setup_sglang.sh --dry-run  # only resolve the requirements with pip (no install)
set -euo pipefail
cd "$(dirname "$0")/.."
REQS=(sglang==0.5.23 torch==2.14.1 transformers==5.19.0 sglang-router)
PY=${PYTHON:-python3.11}
if [[ "${1:-}" == "--dry-run" ]]; then
  exec "$PY" -m pip install --dry-run --ignore-installed --quiet --report - "${REQS[@]}"
fi
[[ -x .venv-sglang/bin/python ]] || "$PY" -m venv .venv-sglang
.venv-sglang/bin/pip install -q --upgrade pip
.venv-sglang/bin/pip install -q "${REQS[@]}"
.venv-sglang/bin/python -c "import sglang, torch; print('[setup_sglang] ok: sglang', sglang.__version__, 'torch', torch.__version__)"
