#!/usr/bin/env bash
# Install everything, then the main job on the embedded default: build bf16 + fp8kv_nvfp4shared of qverify-tiny,
# evaluate both with replicates, gate, and upload the release review to MLflow (sqlite under .qverify/).
# Setup's own output (pip, apt) goes to a log under the workdir; on failure its tail is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
logs="${QVERIFY_WORKDIR:-.qverify}/logs"
mkdir -p "$logs"
setup_log="$logs/setup-$(date +%Y%m%d-%H%M%S).log"
if ! bash scripts/setup.sh >"$setup_log" 2>&1; then
  tail -n 40 "$setup_log" >&2
  echo "error: setup failed (fix: see the full log at $setup_log)" >&2
  exit 3
fi
tail -n 1 "$setup_log"  # [setup] ok: qverify <version>
exec .venv/bin/qverify gate --recipe "${RECIPE:-fp8kv_nvfp4shared}" --config scripts/main-job.toml "$@"
