"""qverify.toml: the one config object every command builds; CLI flags override it.

Unknown keys are errors that name the key (pydantic extra="forbid"); every number is
checked against its range here, at the boundary, so a bad value is one line with the fix
instead of a hang (concurrency 0) or a silent default (limit 0) deep inside a run.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from qverify.errors import BadInput, read_input_text
from qverify.strict import Strict


def parse_budget(text: str) -> tuple[int | None, float | None]:
    """`--budget` and qverify.toml's `budget`: '4000' -> (4000 requests, None); '10m' / '90s' / '1h' ->
    (None, seconds); nothing, or 0, is BadInput. Here, not in qverify.gate.budget: the config checks it, and
    the config sits below the gate."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not m:
        raise BadInput(f"--budget {text!r} is neither a request count nor a time", fix="pass e.g. --budget 10m or --budget 4000")
    value, unit = float(m.group(1)), m.group(2)
    if (value if unit else int(value)) <= 0:
        raise BadInput(f"--budget must be above 0 (got {text})", fix="pass e.g. --budget 10m or --budget 4000")
    if not unit:
        return int(value), None
    return None, value * {"s": 1, "m": 60, "h": 3600}[unit]


# The defaults every command and model takes (one definition each; QVerifyConfig below carries them):
ALPHA = 0.05  # the gate's error rate per metric and build (docs/gate.md, "The rule")
ERROR_BUDGET = 0.02  # the infrastructure-error rate a complete run may have (docs/eval.md)

# Upper bounds that keep a typo from planning a billion requests (memory grows with the plan before the first
# request): above any real benchmark's item count (MMLU ~14k) and any replicate count a gate needs.
MAX_LIMIT = 50_000
MAX_REPLICATES = 100


class MetricRule(Strict):
    gate: bool = True
    tolerance: float | None = Field(None, ge=0, description="absolute tolerance on the delta (same units as the metric)")


class ServingConfig(Strict):
    backend: Literal["local", "sglang", "endpoint"] = "local"
    profile: str | None = Field(None, description="profile name or YAML path (sglang), e.g. b200-tp4")
    endpoint: str | None = None
    served_model: str | None = Field(None, description="the model name the endpoint serves, where its answers and "
                                                       "/v1/models name none (recorded as declared)")
    api_key_env: str | None = None
    concurrency: int | None = Field(None, ge=1, description="requests in flight (default: the backend's, qverify.evals.client.DEFAULT_CONCURRENCY)")
    port: int | None = Field(None, ge=1, le=65535)


class ClientConfig(Strict):
    """Client timeouts; unset ones take the backend's default (qverify.evals.client.DEFAULT_TIMEOUTS)."""

    connect_timeout_s: float | None = Field(None, gt=0, description="to open a connection")
    read_timeout_s: float | None = Field(None, gt=0, description="between bytes; a non-streamed answer arrives whole")
    item_timeout_s: float | None = Field(None, gt=0, description="one item in total, retries included")


class QVerifyConfig(Strict):
    model: str | None = Field(None, description="local HF model dir; default: the embedded qverify-tiny")
    drafter: str | None = None
    trust_remote_code: bool = Field(False, description="the model's own code (Kimi's tokenizer) may run; recorded per build")
    calib_samples: int | None = Field(None, ge=1, description="calibration samples (default: the recipe's)")
    calib_seq_len: int | None = Field(None, ge=1, description="tokens per calibration sample (default: the recipe's)")
    baseline: str = "bf16"
    candidates: list[str] = Field(default_factory=lambda: ["fp8kv_nvfp4shared"])
    suites: list[str] = Field(default_factory=lambda: ["coding", "toolcall", "longctx", "verifier", "kld"])
    replicates: int = Field(3, ge=1, le=MAX_REPLICATES)
    limit: int | None = Field(None, ge=1, le=MAX_LIMIT, description="items per suite (default: each suite's default_n)")
    source: str = "synthetic"
    seed_salt: int = Field(0, ge=0, description="salts every replicate seed: another value is an independent session "
                                                 "(0: the historical seeds); baseline and candidate share seeds only "
                                                 "when evaluated with the same salt")
    alpha: float = Field(ALPHA, gt=0, lt=1)
    family_wise: bool = Field(False, description="several candidates against one baseline: test each at alpha / m "
                                                  "(Bonferroni), so picking whichever PASSes keeps a false PASS <= alpha")
    error_budget: float = Field(ERROR_BUDGET, ge=0, lt=0.5, description="max infrastructure-error rate of a complete run")
    budget: str | None = Field(None, description="gate in rounds within this budget, as `qverify gate --budget` "
                                                  "(a time: 10m, or a request count); the flag wins")
    looks: int = Field(8, ge=1, le=32, description="looks a time budget plans: alpha is spread over them, so plan "
                                                   "no more than the budget can run (a request budget buys its own)")
    noise_k: float | None = Field(None, ge=0, description="margin = max(tolerance, noise_k x the baseline's run-to-run "
                                                           "SD of one run's mean); off by default (docs/gate.md)")
    thresholds: dict[str, MetricRule] = Field(default_factory=dict, description="per metric, e.g. 'coding/pass@1'")
    suite_options: dict[str, dict[str, Any]] = Field(default_factory=dict, description="keyword options per suite, "
                                                     "e.g. [suite_options.\"lmeval:my_task\"] include_path = \"tasks/\"")
    serving: ServingConfig = Field(default_factory=ServingConfig)
    client: ClientConfig = Field(default_factory=ClientConfig)
    allow_unsandboxed: bool = Field(False, description="let the coding suite run model code without bwrap (marked)")
    tracking_uri: str | None = None
    report: bool = True

    @field_validator("budget")
    @classmethod
    def _budget_parses(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                parse_budget(v)  # the flag's own check: a time or a request count above 0
            except BadInput as e:
                raise ValueError(str(e)) from None
        return v


    def alpha_per_candidate(self, candidates: int) -> float:
        """Each candidate's alpha. A candidate's false PASS is <= alpha, so with m candidates gated against one
        baseline, picking whichever PASSes has a false-PASS chance up to 1 - (1 - alpha)^m, about m alpha;
        family_wise splits alpha over the m (Bonferroni), which holds whatever the candidates' dependence."""
        return self.alpha / max(candidates, 1) if self.family_wise else self.alpha


def load_config(path: Path | None) -> QVerifyConfig:
    """Read qverify.toml; a missing default file gives the defaults, a missing explicit one is an error."""
    if path is None:
        default = Path("qverify.toml")
        if not default.exists():
            return QVerifyConfig()
        path = default
    if not path.exists():
        raise BadInput(f"config file {path} not found", fix="pass an existing --config or drop the flag")
    text = read_input_text(path, "config", "pass the path of a qverify.toml (TOML text)")
    try:
        raw: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise BadInput(f"{path}: malformed TOML: {e}", fix="fix the syntax at that line") from None
    try:
        return QVerifyConfig.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        if err["type"] == "extra_forbidden":
            from qverify.registry import unknown_message

            known = _keys_at(err["loc"][:-1])
            raise BadInput(f"{path}: {unknown_message('key', loc, known, lookup=str(err['loc'][-1]))}",
                           fix="remove it or check the spelling (README, 'qverify.toml')") from None
        got = f" (got {err['input']!r})" if not isinstance(err.get("input"), dict | list) else ""
        msg = err["msg"].removeprefix("Value error, ")
        raise BadInput(f"{path}: {loc}: {msg}{got}", fix=f"set {loc} within that range (README, 'qverify.toml')") from None


def _keys_at(loc: tuple) -> list[str]:
    """The keys qverify.toml allows at `loc` (a table such as `serving`), for "did you mean"."""
    model: Any = QVerifyConfig
    for part in loc:
        field = model.model_fields.get(str(part)) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:  # inside a mapping (thresholds.<metric>): the value's model
            args = getattr(model, "__args__", ())
            model = args[-1] if args else None
            continue
        model = field.annotation
    return list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []
