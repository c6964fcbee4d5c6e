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
$PIP install -q -e ".[dev,lmeval,humaneval,sglang-parser]"
# What pip cannot resolve beside this environment, installed without dependencies: pyproject's [tool.qverify]
# no-deps says which and why (bfcl-eval's vendor SDKs; sglang, whose serving uses scripts/setup_sglang.sh).
mapfile -t NODEPS < <(.venv/bin/python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["tool"]["qverify"]["no-deps"], sep="\n")')
$PIP install -q --no-deps "${NODEPS[@]}"
echo "[setup] ok: $(.venv/bin/qverify --version)"
