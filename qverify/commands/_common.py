"""Shared option aliases and helpers for commands."""

from __future__ import annotations

import math
from typing import Annotated

import typer

from qverify.config import MAX_LIMIT, MAX_REPLICATES
from qverify.errors import BadInput

ConfigOpt = Annotated[str | None, typer.Option("--config", help="qverify.toml to read (default ./qverify.toml)")]
# the only ways to allow a build's own code: this flag or qverify.toml's trust_remote_code, never build.json.
# Every command that takes a build accepts both (`trusted` below), so one command line works for them all.
TrustOpt = Annotated[bool, typer.Option("--trust-remote-code", help="allow the build's or model's own code (e.g. "
                                        "Kimi's tokenization_kimi.py) where it needs it, as trust_remote_code = true "
                                        "in qverify.toml does; read that code first")]


def state(ctx: typer.Context):
    return ctx.obj


def trusted(flag: bool, config: str | None) -> bool:
    """The user's permission for a build's own code: --trust-remote-code, else qverify.toml's trust_remote_code."""
    from pathlib import Path

    from qverify.config import load_config

    return flag or load_config(Path(config) if config else None).trust_remote_code


def in_range(ge: float | None = None, gt: float | None = None, lt: float | None = None, le: float | None = None,
             fix: str | None = None):
    """A typer callback that rejects a number outside the range with a one-line BadInput and its fix.

    Typer's own min=/max= would exit through click's usage error without a fix; this names the
    flag, the value, the allowed range and what to pass instead.
    """

    def check(ctx: typer.Context, param: typer.CallbackParam, value: float | None) -> float | None:
        if value is None or ctx.resilient_parsing:
            return value
        flag = max(param.opts, key=len) if getattr(param, "opts", None) else param.name
        if not math.isfinite(value):  # nan passes every comparison below; inf is no count and no time
            raise BadInput(f"{flag} must be a finite number (got {value})", fix=fix or f"pass a number for {flag}")
        bad = ((ge is not None and value < ge) or (gt is not None and value <= gt)
               or (lt is not None and value >= lt) or (le is not None and value > le))
        if bad:
            bounds = " and ".join(f"{op} {b:g}" for op, b in ((">=", ge), (">", gt), ("<", lt), ("<=", le))
                                  if b is not None)
            raise BadInput(f"{flag} must be {bounds} (got {value:g})", fix=fix or f"pass {flag} {bounds}")
        return value

    return check


# --json: declared once, on the root; qverify.cli moves a --json given after the command (`qverify gate ... --json`)
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output: one JSON document on stdout (before "
                                       "or after the command)")]
BUILD_REF_HELP = "build id, unique id prefix, recipe name (one build), or build dir"  # qverify.workdir.Workdir.resolve_build
POSITIVE_INT_FIX = "pass a whole number of 1 or more"
Count = in_range(ge=1, fix=POSITIVE_INT_FIX)
# the upper bounds are QVerifyConfig's (qverify.config), so the flag and qverify.toml refuse the same values
Limit = in_range(ge=1, le=MAX_LIMIT, fix=f"pass a number of items from 1 to {MAX_LIMIT}")
Replicates = in_range(ge=1, le=MAX_REPLICATES, fix=f"pass a number of replicates from 1 to {MAX_REPLICATES} (3 or more to gate)")
Seconds = in_range(gt=0, fix="pass a number of seconds above 0")
Port = in_range(ge=1, le=65535, fix="pass a port between 1 and 65535, or omit it to pick a free one")
ErrorBudget = in_range(ge=0, lt=0.5, fix="pass a rate such as 0.02 (2%); at 0.5 or more half the results could be errors")
SeedSalt = in_range(ge=0, fix="pass a whole number of 0 or more (0: the historical seeds)")
SEED_SALT_HELP = ("salt for every replicate seed: another value is an independent session (default 0, the historical "
                  "seeds); a stored run resumes or grows only with its own salt")


def _profile_help() -> str:
    """--profile's help, built from the profile files so that it lists every built-in. Read with a glob and a
    regex, not qverify.serve.profile: importing qverify.serve costs ~0.4 s at every CLI start."""
    import re
    from pathlib import Path

    by_backend: dict[str, list[str]] = {}
    for p in sorted((Path(__file__).resolve().parents[1] / "serve" / "profiles").glob("*.yaml")):
        m = re.search(r"^backend:\s*(\w+)", p.read_text(), re.MULTILINE)
        by_backend.setdefault(m.group(1) if m else "?", []).append(p.stem)
    builtins = "; ".join(f"{b}: {', '.join(names)}" for b, names in sorted(by_backend.items()))
    return f"serving profile: a YAML file or a built-in ({builtins})"


# Options that several commands take: declared here once each, so their help cannot drift
# (tests/test_cli_options.py checks that no option name is declared twice).
ProfileOpt = Annotated[str | None, typer.Option("--profile", help=_profile_help())]
BackendOpt = Annotated[str | None, typer.Option("--backend", help="local (the embedded CPU server), sglang or endpoint "
                                                "(default: the profile's, else local)")]
PortOpt = Annotated[int | None, typer.Option("--port", callback=Port, help="port to serve on (default: a free one)")]
EndpointOpt = Annotated[str | None, typer.Option("--endpoint", help="URL of a running server or router (the endpoint "
                                                 "backend)")]
KeyEnvOpt = Annotated[str | None, typer.Option("--api-key-env", help="environment variable holding the endpoint's "
                                               "API key")]
TrackingUriOpt = Annotated[str | None, typer.Option("--tracking-uri", help="MLflow server or DB (default: qverify.toml's "
                                                    "tracking_uri, else MLFLOW_TRACKING_URI, else sqlite in the workdir)")]
SeedSaltOpt = Annotated[int | None, typer.Option("--seed-salt", callback=SeedSalt, help=SEED_SALT_HELP)]
SplitOpt = Annotated[str, typer.Option("--split", help="test (default; what the model card reports), validation or "
                                       "train")]
SourceOpt = Annotated[str | None, typer.Option("--source", help="synthetic (default), or a suite's real-data source "
                                               "(humaneval, bfcl)")]
SuitesOpt = Annotated[str | None, typer.Option("--suites", help="comma-separated suite names, lmeval:<task> for an "
                                               "lm-eval task (default: qverify.toml's suites; gate: those the baseline "
                                               "ran)")]
RecipeOpt = Annotated[str | None, typer.Option("--recipe", help="a built-in recipe name (qverify recipes) or a recipe "
                                               "YAML file")]
BaselineOpt = Annotated[str | None, typer.Option("--baseline", help="the baseline: " + BUILD_REF_HELP + " (report "
                                                 "--compare: default the latest gate's)")]
