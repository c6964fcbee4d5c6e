#!/usr/bin/env bash
# Install everything, then the main job on the embedded default: build bf16 + fp8kv_nvfp4shared of qverify-tiny,
# evaluate both with replicates, gate, and upload the release review to MLflow (sqlite under .qverify/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/qverify gate --recipe "${RECIPE:-fp8kv_nvfp4shared}" "$@"
