"""`qverify serve BUILD`: serve a build over the OpenAI-compatible API in the foreground until Ctrl-C."""

from __future__ import annotations

import signal
import sys
import time
from typing import Annotated

import typer

from qverify.commands._common import (
    BUILD_REF_HELP,
    BackendOpt,
    ConfigOpt,
    EndpointOpt,
    KeyEnvOpt,
    PortOpt,
    ProfileOpt,
    Seconds,
    TrustOpt,
    state,
    trusted,
)

DRY_RUN_PORT = 30000  # SGLang's own default --port (srt/arg_groups/arg_utils.py:24)


def serve_cmd(
    ctx: typer.Context,
    build: Annotated[str, typer.Argument(help=BUILD_REF_HELP)],
    backend: BackendOpt = None,
    profile: ProfileOpt = None,
    port: PortOpt = None,
    endpoint: EndpointOpt = None,
    api_key_env: KeyEnvOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the launch command and exit")] = False,
    ready_timeout: Annotated[float | None, typer.Option("--ready-timeout", callback=Seconds,
                                                        help="seconds to wait for readiness (default: the backend's; sglang: the profile's flags.ready_timeout_s)")] = None,
    trust_remote_code: TrustOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Serve a build over an OpenAI-compatible API (local, sglang, endpoint)."""
    from qverify.errors import InfraError
    from qverify.scrub import shown_url
    from qverify.serve import get_backend
    from qverify.serve.base import tail
    from qverify.serve.profile import resolve_profile

    s = state(ctx)
    prof = resolve_profile(backend, profile, endpoint, api_key_env)
    build_dir, manifest = s.workdir.resolve_build(build)
    srv = get_backend(prof.backend)(build_dir, manifest, prof, s.workdir.logs, port=port,
                                    trust_remote_code=trusted(trust_remote_code, config))

    if dry_run:
        if srv.port is None and prof.backend != "endpoint":
            # a fixed port, so the dry run prints the exact command each time (a launch without --port picks a free one)
            srv.port = DRY_RUN_PORT
        lines = srv.shell_lines()
        if s.out.json_mode:
            s.out.data({"backend": prof.backend, "profile": prof.name, "commands": lines, "command": srv.command()})
        else:
            sys.stdout.write("\n".join(lines or [f"# nothing to launch: attach to {shown_url(prof.endpoint)}"]) + "\n")
        return

    # SIGTERM (a scheduler, `timeout`) stops the server exactly as Ctrl-C does. SIGINT is set too: a shell
    # starts background jobs (`cmd &`, nohup, CI runners) with SIGINT ignored, and Python then never turns
    # it into KeyboardInterrupt, so `kill -INT` would leave the server running.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.monotonic()
    ep = srv.start()
    try:
        srv.wait_ready() if ready_timeout is None else srv.wait_ready(ready_timeout)
        ready_s = time.monotonic() - t0
        info = srv.info()
        if s.out.json_mode:
            s.out.data({"endpoint": ep.base_url, "model": ep.model, "backend": prof.backend, "profile": prof.name,
                        "ready_s": round(ready_s, 1), "command": srv.command(), "info": info,
                        "api_key": ep.api_key if prof.backend == "local" else None})
            sys.stdout.flush()
        else:
            accept = info.get("avg_spec_accept_length")
            sys.stdout.write(f"serving {ep.model} at {ep.base_url} ({prof.backend}, profile {prof.name}); "
                             f"ready in {ready_s:.1f}s; KV capacity {info.get('max_total_num_tokens', '?')} tokens"
                             + (f"; accept length {accept}" if accept else "")
                             # the local server's per-launch key: the one who started it is its only user
                             + (f"\nAPI key (Authorization: Bearer): {ep.api_key}" if prof.backend == "local" else "")
                             + "\nCtrl-C to stop\n")
            sys.stdout.flush()
        while srv.alive():
            time.sleep(2.0)
        log = getattr(srv, "log_path", None)
        raise InfraError(f"the {prof.backend} server stopped answering; last log lines:\n{tail(log) if log else '(no log)'}",
                         fix=f"see {log}" if log else "check the server")
    except KeyboardInterrupt:
        s.out.info("stopping")
    finally:
        srv.stop()


def register(app: typer.Typer) -> None:
    app.command("serve", help="Serve a build over an OpenAI-compatible API (local, sglang, endpoint).")(serve_cmd)
