#!/usr/bin/env bash
# Install everything, then run the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
set +e
# two workers, a test file per worker (module fixtures stay on one worker; tests that build or serve overlap the
# others' waits): about 1.6x faster than one process on a 2-core box. QVERIFY_TEST_WORKERS=0 runs in one process.
.venv/bin/python -m pytest -q -n "${QVERIFY_TEST_WORKERS:-2}" --dist loadfile "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then echo "pytest collected no tests: failing on purpose"; exit 1; fi
exit $rc
