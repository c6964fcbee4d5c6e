"""Where library chatter goes: to a log file under <workdir>/logs/, and to the terminal only with -v.

llm-compressor logs ~40 loguru INFO lines per build (to stdout), tqdm draws bars, transformers
warns about things a user cannot act on. By default the console shows qverify's own progress
and errors; everything else is kept in logs/qverify-<time>-<pid>.log (python logging and
warnings) and logs/llmcompressor-<time>-<pid>.log (loguru, as llm-compressor writes it: JSON
lines). `-v` shows it all on stderr as well. Progress bars carry nothing worth keeping, so
they are off unless -v.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

_configured: Path | None = None


class _LazyFileHandler(logging.FileHandler):
    """Opens (and creates the logs dir) on the first record; a log that cannot be written never
    breaks the command (its own errors are reported by the command's own writes)."""

    def _open(self):
        from qverify.workdir import open_append  # here: this module loads before the heavy imports

        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return open_append(Path(self.baseFilename), text=True)  # never through a symlink out of the workdir (#37)

    def handleError(self, record: logging.LogRecord) -> None:
        pass

    def format(self, record: logging.LogRecord) -> str:
        from qverify.scrub import scrub_text

        return scrub_text(super().format(record))  # a key or URL password a library logs never reaches the file


def route_library_logs(logs_dir: Path, verbose: bool) -> Path:
    """Send library logs to a file under `logs_dir` (and to stderr with -v). Call before heavy imports."""
    global _configured
    if _configured is not None:
        return _configured
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    path = logs_dir / f"qverify-{stamp}.log"
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    fh = _LazyFileHandler(path, delay=True)
    fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(fh)
    logging.captureWarnings(True)  # warnings.warn(...) -> the py.warnings logger -> the file
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request would bury the rest
    if verbose:
        sh = logging.StreamHandler(sys.stderr)
        sh.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(sh)
    else:
        os.environ.setdefault("TQDM_DISABLE", "1")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("LLM_COMPRESSOR_LOG_LEVEL", "")  # no console sink (it would write to stdout)
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # "Creating initial MLflow database tables..."
    # A log file an enclosing qverify process routed (inherited by the processes it spawns: a server, a
    # `qverify` subprocess, tests) belongs to that process's workdir, so it is replaced; a user's own is kept.
    inherited = os.environ.get("LLM_COMPRESSOR_LOG_FILE")
    if inherited is None or inherited == os.environ.get("QVERIFY_LLMC_LOG_FILE"):
        os.environ["LLM_COMPRESSOR_LOG_FILE"] = os.environ["QVERIFY_LLMC_LOG_FILE"] = str(
            logs_dir / f"llmcompressor-{stamp}.log")
    os.environ.setdefault("LLM_COMPRESSOR_LOG_FILE_LEVEL", "DEBUG" if verbose else "INFO")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _configured = path
    return path


def quiet_heavy_libraries(verbose: bool) -> None:
    """transformers installs its own stderr handler at import: hand its records to ours instead.

    Called by commands that import transformers anyway (build, eval, gate), not at CLI start,
    so `--help` stays fast.
    """
    if verbose:
        return
    _no_progress_bars()
    from transformers.utils import logging as tlog

    tlog.disable_default_handler()
    tlog.enable_propagation()
    _quiet_torch_logs()
    try:  # loguru's default stderr sink (id 0) -> the file, for loguru users other than llm-compressor
        from loguru import logger

        logger.remove(0)
        logger.add(os.environ["LLM_COMPRESSOR_LOG_FILE"], level="INFO", serialize=True, delay=True)
    except (ImportError, ValueError, KeyError):
        pass


def _quiet_torch_logs() -> None:
    """torch's own logging (torch._logging) puts stderr handlers on "torch" and its registered children and
    stops their propagation; its warnings (e.g. torch.fx's is_fx_tracing notice during oneshot) go to the file
    instead. torch redoes that setup whenever anything calls torch._logging.set_logs (something on oneshot's
    path does), so its _init_logs is wrapped to undo it again each time."""
    from torch._logging import _internal

    for name in ["torch", *[n for n in logging.root.manager.loggerDict if n.startswith("torch.")]]:
        log = logging.getLogger(name)
        plain = [h for h in log.handlers if type(h) is logging.StreamHandler]
        for h in plain:
            log.removeHandler(h)
        if plain:
            log.propagate = True
    init = _internal._init_logs
    if getattr(init, "_qverify_quiet", False):
        return

    def init_then_quiet(*args, **kwargs):
        init(*args, **kwargs)
        _quiet_torch_logs()

    init_then_quiet._qverify_quiet = True
    _internal._init_logs = init_then_quiet


def _no_progress_bars() -> None:
    """tqdm bars off. TQDM_DISABLE only sets a default, and compressed-tensors passes `disable=`
    explicitly ("Applying quantization config" bars on every load), so the flag is forced here."""
    import functools

    from tqdm import std

    init = std.tqdm.__init__
    if getattr(init, "_qverify_quiet", False):
        return

    @functools.wraps(init)
    def quiet_init(self, *args, **kwargs):
        kwargs["disable"] = True
        init(self, *args, **kwargs)

    quiet_init._qverify_quiet = True
    std.tqdm.__init__ = quiet_init
