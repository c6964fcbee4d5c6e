"""qverify.toml: the one config object every command builds; CLI flags override it.

Unknown keys are errors that name the key (pydantic extra="forbid").
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qverify.errors import BadInput


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MetricRule(_Strict):
    gate: bool = True
    tolerance: float | None = Field(None, description="absolute tolerance on the delta (same units as the metric)")


class ServingConfig(_Strict):
    backend: Literal["local", "sglang", "endpoint"] = "local"
    profile: str | None = Field(None, description="profile name or YAML path (sglang), e.g. b200-tp4")
    endpoint: str | None = None
    api_key_env: str | None = None
    concurrency: int = 8
    port: int | None = None


class QVerifyConfig(_Strict):
    model: str | None = Field(None, description="local HF model dir; default: the embedded qverify-tiny")
    drafter: str | None = None
    baseline: str = "bf16"
    candidates: list[str] = Field(default_factory=lambda: ["fp8kv_nvfp4shared"])
    suites: list[str] = Field(default_factory=lambda: ["coding", "toolcall", "longctx", "verifier", "kld"])
    replicates: int = 3
    limit: int | None = Field(None, description="items per suite (default: each suite's default_n)")
    source: str = "synthetic"
    alpha: float = 0.05
    error_budget: float = 0.02
    noise_k: float | None = Field(None, ge=0, description="margin = max(tolerance, noise_k x the baseline's run-to-run "
                                                           "SD of one run's mean); off by default (docs/gate.md)")
    thresholds: dict[str, MetricRule] = Field(default_factory=dict, description="per metric, e.g. 'coding/pass@1'")
    serving: ServingConfig = Field(default_factory=ServingConfig)
    tracking_uri: str | None = None
    report: bool = True


def load_config(path: Path | None) -> QVerifyConfig:
    """Read qverify.toml; a missing default file gives the defaults, a missing explicit one is an error."""
    if path is None:
        default = Path("qverify.toml")
        if not default.exists():
            return QVerifyConfig()
        path = default
    if not path.exists():
        raise BadInput(f"config file {path} not found", fix="pass an existing --config or drop the flag")
    try:
        raw: dict[str, Any] = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise BadInput(f"{path}: malformed TOML: {e}", fix="fix the syntax at that line") from None
    try:
        return QVerifyConfig.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        if err["type"] == "extra_forbidden":
            raise BadInput(f"{path}: unknown key {loc!r}", fix="remove it or check the spelling (README, 'qverify.toml')") from None
        raise BadInput(f"{path}: {loc}: {err['msg']}", fix="see README, 'qverify.toml'") from None
