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
from pydantic import BaseModel, Field, ValidationError, field_validator

from qverify.errors import BadInput, read_input_text
from qverify.models import ServingProfile
from qverify.quantize.kv_scales import DEFAULT_BACKEND, SGLANG_FP8_PATHS
from qverify.registry import Registry
from qverify.serve.sglang_flags import SGLangFlags
from qverify.strict import Strict

PROFILES_DIR = Path(__file__).parent / "profiles"
DEFAULT_PROFILE = {"local": "local", "sglang": "b200-tp4", "endpoint": None}
PREFIX_FIELDS = {"cmd", "node_rank", "nnodes"}


class _Flags(Strict):
    pass


class LocalFlags(_Flags):
    """Flags of the embedded CPU server (python -m qverify.serve.embedded.server)."""

    threads: int | None = Field(None, ge=1, description="torch threads per worker")
    max_batch: int | None = Field(None, ge=1, description="largest batch the server forms")
    no_quant: bool = Field(False, description="switch fake quantization off (logits equal the baseline)")
    no_spec: bool = Field(False, description="ignore the build's drafter")
    speculative: bool | None = Field(None, description="use the drafter (default: when the recipe touches it)")
    attention_backend: str = Field(
        DEFAULT_BACKEND, description="the SGLang MLA backend whose FP8-KV numerics the engine emulates (docs/serve.md, "
                                     "'FP8 KV on SGLang'); trtllm_mla is SGLang's default on B200")

    @field_validator("attention_backend")
    @classmethod
    def _emulated(cls, v: str) -> str:
        if v not in SGLANG_FP8_PATHS:
            raise ValueError(f"the embedded engine emulates {', '.join(SGLANG_FP8_PATHS)}, not {v!r}")
        return v


class EndpointFlags(_Flags):
    """An attached endpoint launches nothing, so it takes no flags."""


# each backend's flags model, by backend name (also what answers an unknown --backend with "did you mean")
FLAGS_MODELS: Registry[type[BaseModel]] = Registry("serving backend")
for _name, _model in (("local", LocalFlags), ("sglang", SGLangFlags), ("endpoint", EndpointFlags)):
    FLAGS_MODELS.add(_name, _model)


def builtin_profiles() -> Registry[Path]:
    reg: Registry[Path] = Registry("serving profile")
    for p in sorted(PROFILES_DIR.glob("*.yaml")):
        reg.add(p.stem, p)
    return reg


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
        flags = FLAGS_MODELS.get(profile.backend).model_validate(profile.flags)
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


MODEL_SETTINGS = ("chat_template_kwargs", "max_tokens", "api_key_env")  # what a profile says about the model and its API


def model_settings(prof: ServingProfile) -> ServingProfile:
    """A profile's model settings (chat template kwargs, output budgets per suite, the API key's variable) without
    its launch settings (backend flags, tp, launcher): an endpoint profile for a server the profile's model runs on,
    so `--backend endpoint --profile kimi-k2.6` sends Kimi's `thinking: false` and its budgets (docs/serve.md)."""
    return ServingProfile(name=prof.name, backend="endpoint", **{k: getattr(prof, k) for k in MODEL_SETTINGS})


def resolve_profile(backend: str | None = None, profile: str | None = None, endpoint: str | None = None,
                    api_key_env: str | None = None) -> ServingProfile:
    """The profile a command runs with: --profile, else the backend's default, with --endpoint/--api-key-env applied."""
    if backend is not None:
        FLAGS_MODELS.get(backend)  # an unknown backend raises "did you mean"
    if profile:
        prof = load_profile(profile)
        if (backend or ("endpoint" if endpoint else prof.backend)) == "endpoint" and prof.backend != "endpoint":
            prof = model_settings(prof)  # attaching to a server someone launched: the model's settings still apply
        elif backend and backend != prof.backend:
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
    if prof.backend == "endpoint":
        from qverify.serve.endpoint import check_endpoint_url  # the backend's own check, before any command runs

        check_endpoint_url(prof.endpoint)
    return prof
