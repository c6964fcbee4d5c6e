"""The SGLang flags model: which SGLang 0.5.23 server arguments a serving profile may set, and their checks; and
which interpreter runs SGLang (`sglang_python`, checked before a launch by `check_sglang_imports`).

Field names are SGLang's own (`mem_fraction_static` is `--mem-fraction-static`); extra="forbid" makes a
misspelt option fail when the profile loads instead of reaching the server.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from pydantic import Field, model_validator

from qverify.errors import BadInput
from qverify.models import ServingProfile
from qverify.strict import Strict


class SGLangFlags(Strict):
    """SGLang 0.5.23 server arguments a profile may set, by SGLang's field names."""

    python: str | None = Field(None, description="SGLang's interpreter (default: $QVERIFY_SGLANG_PYTHON, else the "
                               "repository's .venv-sglang/bin/python made by scripts/setup_sglang.sh); refused at "
                               "launch when sglang does not import there")
    # qverify's, not SGLang's: how long to wait for /health_generate. A cold 1T-parameter start reads ~590 GB of
    # weights (about 10 min at 1 GB/s per node), then captures CUDA graphs and autotunes trtllm kernels for the target
    # and the EAGLE3 drafter; 20 min was the old default and may be short, so 1 h
    ready_timeout_s: float = Field(3600.0, gt=0, description="seconds to wait for readiness (qverify serve --ready-timeout overrides)")
    trust_remote_code: bool = Field(False, description="--trust-remote-code, when the user also allows it (qverify's "
                                                    "--trust-remote-code or qverify.toml)")
    host: str | None = Field(None, description="bind address (default: the backend's host, 127.0.0.1)")
    mem_fraction_static: float | None = Field(None, gt=0, le=1)
    context_length: int | None = Field(None, gt=0)
    enable_hierarchical_cache: bool = False
    hicache_ratio: float | None = Field(None, gt=0, description="host KV pool size / device KV pool size")
    tool_call_parser: str | None = "kimi_k2"
    reasoning_parser: str | None = None
    use_drafter: bool = Field(True, description="speculative decoding with the build's drafter, when it has one")
    speculative_algorithm: str | None = Field(
        None, description="None: from the drafter (STANDALONE for a separate draft model, EAGLE/EAGLE3 for a head)")
    speculative_num_steps: int | None = Field(None, ge=1)
    speculative_eagle_topk: int | None = Field(None, ge=1)
    speculative_num_draft_tokens: int | None = Field(None, ge=2)
    enable_deterministic_inference: bool = Field(False, description="batch-invariant kernels; ~34% slower")
    random_seed: int | None = None
    enable_metrics: bool = True
    nnodes: int = Field(1, ge=1)
    dist_init_addr: str | None = Field(None, description="HOST:PORT of node 0, for multi-node")
    extra_args: list[str] = Field(default_factory=list, description="further SGLang CLI args, verbatim")

    @model_validator(mode="after")
    def _consistent(self) -> SGLangFlags:
        if self.hicache_ratio is not None and not self.enable_hierarchical_cache:
            raise ValueError("hicache_ratio needs enable_hierarchical_cache: true")
        spec = (self.speculative_num_steps, self.speculative_eagle_topk, self.speculative_num_draft_tokens)
        if any(v is not None for v in spec) and any(v is None for v in spec):
            # SGLang asserts all-or-none when it auto-chooses the rest
            raise ValueError("set all of speculative_num_steps, speculative_eagle_topk, "
                             "speculative_num_draft_tokens, or none of them")
        steps, topk, draft = spec
        if topk == 1 and draft is not None and draft != steps + 1:
            # SGLang would silently rewrite it; qverify records what actually runs
            raise ValueError(f"with speculative_eagle_topk 1, speculative_num_draft_tokens must be "
                             f"speculative_num_steps + 1 = {steps + 1}")
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ValueError("nnodes > 1 needs dist_init_addr (HOST:PORT of node 0)")
        if any(a.split("=")[0] in ("--api-key", "--admin-api-key") for a in self.extra_args):
            raise ValueError("never put an API key in a profile; set api_key_env to the variable that holds it")
        return self


def sglang_flags(profile: ServingProfile) -> SGLangFlags:
    return SGLangFlags.model_validate(profile.flags)


# where scripts/setup_sglang.sh makes SGLang's virtualenv: next to qverify's source tree, wherever qverify runs from
SGLANG_VENV_PYTHON = Path(__file__).resolve().parents[2] / ".venv-sglang" / "bin" / "python"
FIX_PYTHON = "run scripts/setup_sglang.sh (makes .venv-sglang), or set the profile's flags.python or $QVERIFY_SGLANG_PYTHON"


def sglang_python(configured: str | None) -> str:
    """The interpreter that has SGLang: it needs torch 2.14.1 / transformers 5.19, so it lives in its own
    virtualenv rather than qverify's. The profile's flags.python, else $QVERIFY_SGLANG_PYTHON, else the repository's
    .venv-sglang (not the current directory's, and never qverify's own interpreter, which has no sglang)."""
    import os

    return configured or os.environ.get("QVERIFY_SGLANG_PYTHON") or str(SGLANG_VENV_PYTHON)


def check_sglang_imports(python: str, timeout_s: float = 600.0) -> None:
    """Refuse, before a launch that would fail minutes later, an interpreter that is missing or has no sglang.
    (`import sglang` takes seconds to a minute on a busy machine: it is run once per launch.)"""
    try:
        r = subprocess.run([python, "-c", "import sglang"], capture_output=True, text=True, timeout=timeout_s,
                           stdin=subprocess.DEVNULL, check=False)
    except OSError as e:
        raise BadInput(f"SGLang's interpreter {python} cannot run: {e.strerror}", fix=FIX_PYTHON) from None
    except subprocess.TimeoutExpired:
        raise BadInput(f"`{python} -c 'import sglang'` did not finish in {timeout_s:.0f}s", fix=FIX_PYTHON) from None
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1]
        raise BadInput(f"sglang does not import with {python}: {last}", fix=FIX_PYTHON)
