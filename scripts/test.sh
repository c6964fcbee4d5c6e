#!/usr/bin/env bash
# Install everything, lint, then run the whole test suite (what CI runs). Extra arguments go to pytest:
# `bash scripts/test.sh -m "not slow"` is the fast tier.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Lint first: a lint failure fails the run (rules and complexity thresholds: pyproject.toml [tool.ruff.lint]).
.venv/bin/ruff check qverify
set +e
.venv/bin/python -m pytest -q --durations=25 "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then echo "pytest collected no tests: failing on purpose"; exit 1; fi
exit $rc
