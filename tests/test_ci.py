"""CI (scripts/test.sh, which .ci/run runs) lints before it tests, with the complexity rules on, and reports
test durations; the package passes that lint."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = (ROOT / "scripts/test.sh").read_text()


def test_ci_lints_before_it_tests_and_prints_durations():
    lines = [ln.strip() for ln in SCRIPT.splitlines() if not ln.lstrip().startswith("#")]
    ruff = next(i for i, ln in enumerate(lines) if ln.startswith(".venv/bin/ruff check qverify"))
    pytest_line = next(i for i, ln in enumerate(lines) if "-m pytest" in ln)
    assert ruff < pytest_line and "set +e" not in lines[:ruff]  # under `set -e`: a lint failure ends the run
    assert "--durations=25" in lines[pytest_line]


def test_complexity_rules_are_selected_with_written_thresholds():
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert {"C901", "PLR0912", "PLR0915"} <= set(lint["extend-select"])
    assert lint["mccabe"]["max-complexity"] == 10
    assert lint["pylint"] == {"max-branches": 12, "max-statements": 50}


def test_the_package_passes_ruff():
    ruff = Path(sys.executable).with_name("ruff")
    p = subprocess.run([str(ruff), "check", "--no-cache", "--output-format", "concise", "qverify"], cwd=ROOT,
                       capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stdout[-3000:]
