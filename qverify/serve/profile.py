"""Serving profiles: one YAML file says how a build is served (backend, parallelism, backend flags).

A profile file is `qverify.models.ServingProfile` plus an optional `description`. Its `flags`
are validated per backend with extra="forbid", so a misspelt SGLang option fails loudly here
instead of being dropped or reaching the server. SGLang flags use SGLang's own field names
(`mem_fraction_static` is `--mem-fraction-static`), so a profile reads like the launch command.

Built-in profiles live in qverify/serve/profiles/<name>.yaml; `load_profile` takes a name or a path.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from qverify.errors import BadInput, read_input_text
from qverify.models import ServingProfile
from qverify.registry import Registry

PROFILES_DIR = Path(__file__).parent / "profiles"
DEFAULT_PROFILE = {"local": "local", "sglang": "b200-tp4", "endpoint": None}
PREFIX_FIELDS = {"cmd", "node_rank", "nnodes"}


class _Flags(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LocalFlags(_Flags):
    """Flags of the embedded CPU server (python -m qverify.serve.local_server)."""

    threads: int | None = Field(None, ge=1, description="torch threads per worker")
    max_batch: int | None = Field(None, ge=1, description="largest batch the server forms")
    no_quant: bool = Field(False, description="switch fake quantization off (logits equal the baseline)")
    no_spec: bool = Field(False, description="ignore the build's drafter")
    speculative: bool | None = Field(None, description="use the drafter (default: when the recipe touches it)")


class EndpointFlags(_Flags):
    """An attached endpoint launches nothing, so it takes no flags."""


class SGLangFlags(_Flags):
    """SGLang 0.5.23 server arguments a profile may set, by SGLang's field names."""

    python: str | None = Field(None, description="interpreter on the serving node (default: this one)")
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


FLAGS_MODELS: dict[str, type[_Flags]] = {"local": LocalFlags, "sglang": SGLangFlags, "endpoint": EndpointFlags}


def sglang_flags(profile: ServingProfile) -> SGLangFlags:
    return SGLangFlags.model_validate(profile.flags)


def builtin_profiles() -> Registry[Path]:
    reg: Registry[Path] = Registry("serving profile")
    for p in sorted(PROFILES_DIR.glob("*.yaml")):
        reg.add(p.stem, p)
    return reg


def describe_profiles() -> list[dict[str, Any]]:
    """Name, backend, tp and description of each built-in profile (for listings)."""
    rows = []
    for name, path in builtin_profiles().items():
        raw = yaml.safe_load(path.read_text()) or {}
        rows.append({"name": name, "backend": raw.get("backend", "local"), "tp": raw.get("tp", 1),
                     "description": raw.get("description", "")})
    return rows


def load_profile(name_or_path: str | Path) -> ServingProfile:
    """A built-in profile by name, or a YAML file by path; anything invalid is one-line BadInput."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise BadInput(f"profile file {path} not found", fix="pass an existing YAML file or a built-in profile name")
    else:
        path = builtin_profiles().get(text)  # unknown name -> "did you mean"
    text = read_input_text(path, "profile", "pass a profile YAML file or a built-in profile name")
    return parse_profile(text, source=str(path), default_name=path.stem)


def parse_profile(text: str, source: str = "<profile>", default_name: str = "custom") -> ServingProfile:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise BadInput(f"{source}{where}: malformed YAML: {getattr(e, 'problem', None) or e}",
                       fix="fix the syntax at that line") from None
    if not isinstance(raw, dict):
        raise BadInput(f"{source}: a profile must be a YAML mapping", fix="see docs/serve.md, 'Profiles'")
    raw = dict(raw)
    raw.pop("description", None)
    raw.setdefault("name", default_name)
    try:
        profile = ServingProfile.model_validate(raw)
        flags = FLAGS_MODELS[profile.backend].model_validate(profile.flags)
    except ValidationError as e:
        raise BadInput(f"{source}: {_first_error(e, raw)}", fix="see docs/serve.md, 'Profiles'") from None
    _check_prefix(profile.command_prefix, source)
    # store the validated flags with defaults filled in: the run records what was actually used
    return profile.model_copy(update={"flags": flags.model_dump()})


def _first_error(e: ValidationError, raw: dict[str, Any]) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    if err["type"] == "extra_forbidden":
        where = loc if loc in raw else f"flags.{loc}"
        return f"unknown key {where!r} for backend {raw.get('backend', 'local')!r}"
    if err["loc"] and str(err["loc"][0]) in raw:
        return f"{loc}: {err['msg']}"
    return f"flags{'.' + loc if loc else ''}: {err['msg'].removeprefix('Value error, ')}"


def _check_prefix(prefix: str | None, source: str) -> None:
    if prefix is None:
        return
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(prefix) if f is not None}
    except ValueError as e:
        raise BadInput(f"{source}: command_prefix: {e}", fix="use {cmd}, {node_rank}, {nnodes}; write {{ }} for braces") from None
    unknown = fields - PREFIX_FIELDS
    if unknown or "cmd" not in fields:
        what = f"unknown placeholder {{{min(unknown)}}}" if unknown else "no {cmd} placeholder"
        raise BadInput(f"{source}: command_prefix has {what}",
                       fix="e.g. 'srun --nodes=1 --ntasks=1 --relative={node_rank} {cmd}'")


def resolve_profile(backend: str | None = None, profile: str | None = None, endpoint: str | None = None,
                    api_key_env: str | None = None) -> ServingProfile:
    """The profile a command runs with: --profile, else the backend's default, with --endpoint/--api-key-env applied."""
    if backend is not None and backend not in FLAGS_MODELS:
        reg: Registry[str] = Registry("serving backend")
        for name in FLAGS_MODELS:
            reg.add(name, name)
        reg.get(backend)  # raises "did you mean"
    if profile:
        prof = load_profile(profile)
        if backend and backend != prof.backend:
            raise BadInput(f"profile {prof.name!r} is for the {prof.backend} backend, not {backend}",
                           fix=f"drop --backend, or pass a {backend} profile")
    else:
        chosen = backend or ("endpoint" if endpoint else "local")
        default = DEFAULT_PROFILE[chosen]
        prof = load_profile(default) if default else ServingProfile(name="endpoint", backend="endpoint")
    if endpoint:
        if prof.backend != "endpoint":
            raise BadInput(f"--endpoint applies to the endpoint backend, not {prof.backend}",
                           fix="add --backend endpoint, or drop --endpoint")
        prof = prof.model_copy(update={"endpoint": endpoint})
    if api_key_env:
        prof = prof.model_copy(update={"api_key_env": api_key_env})
    if prof.backend == "endpoint" and not prof.endpoint:
        raise BadInput("the endpoint backend needs a URL", fix="pass --endpoint http://HOST:PORT")
    return prof
