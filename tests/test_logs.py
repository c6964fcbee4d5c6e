"""Library-log routing: a child process writes llm-compressor's log into its own workdir, not its parent's."""

import os
import subprocess
import sys

import pytest

CODE = ("import os, sys; from pathlib import Path; from qverify.logs import route_library_logs; "
        "route_library_logs(Path(sys.argv[1]), False); print(os.environ['LLM_COMPRESSOR_LOG_FILE'])")


def _routed(logs_dir, **env):
    full = {k: v for k, v in os.environ.items() if k not in ("LLM_COMPRESSOR_LOG_FILE", "QVERIFY_LLMC_LOG_FILE")}
    out = subprocess.run([sys.executable, "-c", CODE, str(logs_dir)], env={**full, **env},
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_a_log_file_inherited_from_a_qverify_parent_is_replaced(tmp_path):
    # what an in-process CLI call (a test, a pipeline) leaves in os.environ for the processes it spawns
    parent = str(tmp_path / "parent" / "llmcompressor-1.log")
    got = _routed(tmp_path / "child", LLM_COMPRESSOR_LOG_FILE=parent, QVERIFY_LLMC_LOG_FILE=parent)
    assert got.startswith(str(tmp_path / "child" / "llmcompressor-"))


def test_a_users_own_log_file_is_kept(tmp_path):
    mine = str(tmp_path / "mine.log")
    assert _routed(tmp_path / "child", LLM_COMPRESSOR_LOG_FILE=mine) == mine


# the second case: llm-compressor's oneshot path calls torch._logging.set_logs, which puts torch's stderr handlers back
@pytest.mark.parametrize("after_quiet", ["", "torch._logging.set_logs(); "])
def test_torch_warnings_go_to_the_file_not_the_console(tmp_path, after_quiet):
    code = ("import logging, sys; from pathlib import Path; import torch; "
            "from qverify.logs import route_library_logs, quiet_heavy_libraries; "
            "route_library_logs(Path(sys.argv[1]), False); quiet_heavy_libraries(False); " + after_quiet +
            "logging.getLogger('torch.fx._symbolic_trace').warning('is_fx_tracing will return true')")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert "is_fx_tracing" not in r.stderr + r.stdout
    assert any("is_fx_tracing" in p.read_text() for p in tmp_path.glob("qverify-*.log"))
