"""The pipeline's data model: typed artifacts passed between build → serve → eval → gate → report.

Every model round-trips through JSON (`model_dump_json` / `model_validate_json`);
everything a result depends on (recipe, suite version, sampling, server command)
is recorded on the artifact that holds the result.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import Field, field_validator

from qverify.config import ERROR_BUDGET
from qverify.strict import Record, Strict  # one base, one rule (unknown keys, nan/inf, booleans)

Split = Literal["train", "validation", "test"]
SPLITS: tuple[str, ...] = ("train", "validation", "test")


def canonical_split(split: str) -> Split:
    """'held-out' (the name before validation and test were separated) means test: the one place that says so."""
    split = "test" if split == "held-out" else split
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} (one of {', '.join(SPLITS)})")
    return split  # type: ignore[return-value]


def content_hash(obj: Any, n: int = 16) -> str:
    """Stable hash of JSON-able content: sorted keys, no whitespace, sha256 prefix."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:n]


def utcnow() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# Build ids and recipe names become folder names (builds/<id>, runs/<id>): one path component that cannot
# climb (`..`), hide (a leading dot: temp dirs) or reach elsewhere (`/`). A build.json or recipe handed to us is
# untrusted, so this is checked where they are read (BuildManifest, quantize.recipe.Recipe).
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")


def safe_name(value: str, what: str) -> str:
    """`value` if it is one safe path component (SAFE_NAME), else ValueError (pydantic reports it as invalid input)."""
    if not SAFE_NAME.fullmatch(value):
        raise ValueError(f"{what} {value!r} is not a safe name: letters, digits and . _ + - only, "
                         "not starting with a dot, at most 200 characters")
    return value


DRAFTER_PREFIX = "drafter/"  # a build's drafter lives in its drafter/ folder (qverify.quantize.loader.DRAFTER_DIR)




# --------------------------------------------------------------------------- build


class SchemeSummary(Strict):
    """One quantization scheme as applied to the model."""

    scheme: str = Field(description="e.g. NVFP4, FP8_DYNAMIC, or 'kv_cache:fp8'")
    targets: list[str] = Field(default_factory=list)
    modules: int = Field(0, description="number of Linear modules quantized with this scheme")
    params: int = Field(0, description="parameters in those modules")
    format: str | None = Field(None, description="compressed-tensors format, e.g. nvfp4-pack-quantized")


class BuildManifest(Strict):
    """`build.json`: what a serving build is and where it came from."""

    build_id: str = Field(description="content hash of (source tensors, recipe, calibration, versions)")
    recipe: str
    recipe_hash: str
    recipe_text: str
    source_model: str
    source_hash: str = Field(description="hash over the source model's tensor hashes")
    drafter: str | None = Field(None, description="source drafter path, if the build has one")
    calibration: dict[str, Any] = Field(default_factory=dict, description="fingerprint, samples, seq_len")
    versions: dict[str, str] = Field(default_factory=dict)
    quantization: list[SchemeSummary] = Field(default_factory=list)
    serving: dict[str, Any] = Field(default_factory=dict, description="serving settings the recipe implies")
    bytes_by_dtype: dict[str, int] = Field(default_factory=dict)
    total_bytes: int = 0
    kv_dtype: str = "bf16"
    kv_bytes_per_token: int = 0
    tensor_hashes: dict[str, str] = Field(default_factory=dict, description="file -> tensor name -> sha256 (flattened 'file::name')")
    control: bool = Field(False, description="a lossy control build, expected to FAIL the gate")
    kv_scales: dict[str, Any] = Field(
        default_factory=dict, description="FP8 KV: the k_scale SGLang will use and compressed-tensors' pair "
                                          "(1.0, not calibrated; qverify/quantize/kv_scales.py)")
    trust_remote_code: bool = Field(False, description="the source needs its own code (auto_map), explicitly allowed")
    source_quantization: dict[str, Any] | None = Field(
        None, description="what the source already carried (e.g. Kimi's INT4 routed experts), kept byte for byte")
    carried_files: list[str] = Field(default_factory=list, description="non-weight source files carried into the build")
    drafter_kind: str = Field("causal-lm", description="'causal-lm' (reloaded and compared) or 'eagle3' (checked, carried)")
    composed_from: dict[str, str] | None = Field(
        None, description="a composed build (qverify/quantize/twin.py): {'target': build id, 'drafter': build id}")
    created: str = Field(default_factory=utcnow)

    @field_validator("build_id")
    @classmethod
    def _safe_id(cls, v: str) -> str:
        return safe_name(v, "build_id")

    def remote_code(self, trusted: bool) -> bool:
        """Whether the build's own code (auto_map: Kimi's tokenization_kimi.py) may run: only when the build needs
        it AND the user allowed it (`--trust-remote-code` or qverify.toml's trust_remote_code). build.json's flag
        alone never turns it on: a build directory someone hands us would otherwise run its Python as root.
        Called before anything of the build is imported; BadInput (exit 4) when needed and not allowed."""
        if self.trust_remote_code and not trusted:
            from qverify.errors import TRUST_FIX, BadInput

            raise BadInput(f"build {self.build_id} runs its own Python (build.json), not allowed here", fix=TRUST_FIX)
        return self.trust_remote_code

    def part_hashes(self, part: Literal["target", "drafter"]) -> dict[str, str]:
        """tensor_hashes of the served target or of the drafter (files under drafter/). recipe.yaml is
        provenance, not served content, so it is in neither: a composed build's differs by design."""
        drafter = {k: v for k, v in self.tensor_hashes.items() if k.startswith(DRAFTER_PREFIX)}
        if part == "drafter":
            return drafter
        return {k: v for k, v in self.tensor_hashes.items() if k not in drafter and not k.startswith("recipe.yaml::")}


# --------------------------------------------------------------------------- serve


class ServingProfile(Strict):
    """How a build is served: backend, parallelism and extra flags."""

    name: str = "local"
    backend: Literal["local", "sglang", "endpoint"] = "local"
    tp: int = 1
    flags: dict[str, Any] = Field(default_factory=dict, description="backend flags, e.g. SGLang CLI options")
    endpoint: str | None = None
    served_model: str | None = Field(None, description="the model name an endpoint serves, declared by the user where "
                                                       "the server names none (--served-model); runs record it as declared")
    api_key_env: str | None = Field(None, description="environment variable holding the API key (never the key)")
    command_prefix: str | None = Field(None, description="launcher template for multi-node, e.g. 'srun -N2 {cmd}'")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="sent with every chat request, e.g. {thinking: false} for Kimi K2.x")
    max_tokens: dict[str, int] = Field(
        default_factory=dict, description="output budget per suite ('*': every suite); replaces the suite's own")

    def request_options(self, suite: str) -> dict[str, Any]:
        """What a suite adds to its requests for this model (see Suite.request)."""
        out: dict[str, Any] = {}
        if self.chat_template_kwargs:
            out["chat_template_kwargs"] = dict(self.chat_template_kwargs)
        budget = self.max_tokens.get(suite, self.max_tokens.get("*"))
        if budget is not None:
            out["max_tokens"] = budget
        return out


class Endpoint(Strict):
    base_url: str
    model: str
    listed_models: list[str] = Field(default_factory=list, description="what the server's /v1/models listed")
    api_key: str = Field("EMPTY", exclude=True, repr=False)


# --------------------------------------------------------------------------- suites


class Sampling(Strict):
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: list[str] | None = None
    logprobs: bool = False
    top_logprobs: int | None = None


class Item(Strict):
    """One evaluation item. `id` is a content hash so results pair across builds."""

    id: str
    suite: str
    split: Literal["train", "validation", "test"] = "test"
    kind: Literal["chat", "completion"] = "chat"
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    prompt: str | None = Field(None, description="raw prompt for completion-style items (kld)")
    target: dict[str, Any] = Field(default_factory=dict, description="what the scorer needs: tests, expected calls, answer")
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("split", mode="before")
    @classmethod
    def _held_out_is_test(cls, v: Any) -> Any:
        return canonical_split(v) if v == "held-out" else v  # runs written before validation and test were separated

    @classmethod
    def make(cls, suite: str, split: str, **content: Any) -> Item:
        key = {k: content.get(k) for k in ("messages", "tools", "prompt", "target", "kind")}
        return cls(id=f"{suite}-{content_hash(key, 12)}", suite=suite, split=split, **content)


class ToolCall(Strict):
    id: str | None = None
    name: str
    arguments: str = Field(description="raw JSON text as the server returned it")


class Response(Record):
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, int] = Field(default_factory=dict)
    logprobs: list[dict[str, Any]] | None = Field(None, description="per token: {token, logprob, top: {tok: lp}}")
    meta_info: dict[str, Any] = Field(default_factory=dict)
    model: str | None = Field(None, description="the model name the server answered with")


class Score(Record):
    """A scorer's verdict on one response. `values` are per-item metric values in [0,1] (or a distance)."""

    values: dict[str, float]
    reason: str | None = Field(None, description="why it failed, in a few words; None when it passed")
    answer: str | None = Field(None, description="what was extracted from the response")


class ItemResult(Record):
    """One (item, replicate) outcome, one line of r<k>.jsonl."""

    item_id: str
    suite: str
    replicate: int
    seed: int
    request_hash: str
    response: Response | None = None
    scores: dict[str, float] = Field(default_factory=dict)
    reason: str | None = None
    error: str | None = Field(None, description="infrastructure error class; such results are never scored")
    latency_s: float | None = None
    ttft_s: float | None = None
    accept_length: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


# --------------------------------------------------------------------------- eval


class RunManifest(Record):
    """Binds a run's results to everything they depend on."""

    def model_identity(self) -> tuple[str, tuple[str, ...]] | None:
        """Who answered, as the server says (`answered` names in its answers, else `listed` at /v1/models), or as
        the user declared it (--served-model); None when an endpoint named no model and none was declared. A
        server qverify launched from the build (local, sglang) is the build: its name is its build id."""
        if self.answered_models:
            return "answered", tuple(self.answered_models)
        if self.listed_models:
            return "listed", tuple(self.listed_models)
        if self.serving.served_model:
            return "declared", (self.serving.served_model,)
        if self.serving.backend != "endpoint":
            return "launched", (self.served_model or self.build_id,)
        return None

    def served_other(self) -> list[str]:
        """Model names this run was served under that are not its build id: the gate refuses such a run."""
        return sorted({n for n in (self.served_model, *self.answered_models) if n and n != self.build_id})

    build_id: str
    suite: str
    suite_version: str
    item_set_hash: str
    n_items: int
    replicates: int
    split: str = "test"
    source: str = "synthetic"
    sampling: Sampling
    serving: ServingProfile
    server_command: list[str] | None = None
    server_info: dict[str, Any] = Field(default_factory=dict)
    versions: dict[str, str] = Field(default_factory=dict)
    error_budget: float = ERROR_BUDGET
    error_rate: float = 0.0
    complete: bool = False
    sandbox: Literal["bwrap", "unsandboxed"] | None = Field(
        None, description="where model code ran (suites that execute it); the gate never compares the two")
    perf: dict[str, float] = Field(default_factory=dict, description="ttft, decode tok/s, accept length")
    seed_salt: int = Field(0, description="replicate seeds' salt (0: the historical seeds; manifests without it had 0)")
    served_model: str | None = Field(None, description="the model name requests asked for (the endpoint's pick when "
                                                        "the build id was not listed); None in runs made before it")
    answered_models: list[str] = Field(default_factory=list, description="model names the server's answers carried")
    listed_models: list[str] = Field(default_factory=list, description="model names the server's /v1/models listed")
    started: str = Field(default_factory=utcnow)
    finished: str | None = None


# --------------------------------------------------------------------------- gate

Verdict = Literal["PASS", "FAIL", "INCONCLUSIVE"]


class MetricResult(Record):
    metric: str = Field(description="suite/metric, e.g. coding/pass@1")
    direction: Literal["higher", "lower"] = "higher"
    gated: bool = True
    baseline_mean: float
    candidate_mean: float
    baseline_spread: list[float] = Field(default_factory=list, description="per-replicate means")
    candidate_spread: list[float] = Field(default_factory=list)
    delta: float
    ci_low: float
    ci_high: float
    noise_band: float
    tolerance: float
    mde: float
    p_value: float | None = None
    p_adjusted: float | None = None
    flips: dict[str, float] = Field(default_factory=dict)
    n_items: int = 0
    method: str = "paired-bootstrap"
    verdict: Verdict
    reason: str
    advice: str | None = None
    details: dict[str, Any] = Field(default_factory=dict, description="noise model, band level, SE, McNemar, F1 floor, ...")


class CandidateReport(Record):
    build_id: str
    recipe: str
    verdict: Verdict
    reasons: list[str] = Field(default_factory=list)
    metrics: list[MetricResult] = Field(default_factory=list)
    perf: dict[str, float] = Field(default_factory=dict)
    integrity: list[str] = Field(default_factory=list, description="why the gate refused to pass (empty: runs are comparable)")
    seed_salts: dict[str, list[int]] = Field(default_factory=dict, description="the runs' seed salts per side; "
                                             "equal salts: replicate k shares its seed across builds (common random numbers)")
    compared_with: dict[str, str] = Field(default_factory=dict, description="metric -> the build it was compared with "
                                          "when that is not the baseline (greedy/match: the candidate's target with the "
                                          "baseline's drafter, docs/gate.md)")


class GateReport(Record):
    gate_id: str
    baseline: str
    baseline_recipe: str = "bf16"
    verdict: Verdict
    candidates: list[CandidateReport]
    config: dict[str, Any] = Field(default_factory=dict)
    created: str = Field(default_factory=utcnow)
