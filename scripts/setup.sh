#!/usr/bin/env bash
# Install everything qverify needs into ./.venv (idempotent). Used by scripts/test.sh, scripts/main.sh and CI.
#   - torch: the CPU wheel (torch==2.13.0) where no NVIDIA GPU is present, the CUDA build where one is;
#     an unpinned torch would pull a multi-GB CUDA build onto a CPU box.
#   - Debian packages the tests need: bubblewrap (coding sandbox), util-linux (prlimit, setpriv),
#     python3 (/usr/bin/python3 inside the sandbox), chromium (report and MLflow screenshots).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=()
  for pkg in bubblewrap util-linux python3 chromium; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
  done
  if [ ${#need[@]} -gt 0 ]; then
    echo "[setup] apt-get install ${need[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip >/dev/null
# The same pin gives the right build on each kind of host: on this CPU box pip takes the CPU wheel that lies
# on local disk (PIP_FIND_LINKS); on a GPU host PyPI's torch==2.13.0 is the CUDA build.
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then echo "[setup] NVIDIA GPU: CUDA torch"; fi
$PIP install -q "torch==2.13.0"
$PIP install -q -e ".[dev]"
# bfcl-eval without its vendor SDKs (its data and ast_checker work offline); sglang for its CLI parser only
# (tests validate generated command lines, its kimi_k2 tool-call detector and its weight-name mapping against it;
# serving uses SGLang's own virtualenv: scripts/setup_sglang.sh). partial-json-parser: the detector's import.
$PIP install -q --no-deps "bfcl-eval==2026.3.23" "sglang==0.5.23" "triton==3.9.0"
$PIP install -q orjson pybase64 msgspec pyzmq IPython "partial-json-parser==0.2.1.1.post7" "openai==3.57.0"
echo "[setup] ok: $(.venv/bin/qverify --version)"
