"""sglang: launch `python -m sglang.launch_server` for a build, from its manifest and a serving profile.

The build says *what* is served: the checkpoint, its quantization, the KV-cache dtype the recipe
implies, and the drafter in `drafter/` with its quantization. The profile says *how*: parallelism,
memory, parsers, hierarchical cache, speculative settings, multi-node layout.

The API key comes from the environment variable the profile names. It is passed to SGLang on its
command line (SGLang reads it nowhere else) but never recorded: `command()` / `redacted_command()`
show `${VAR}`, the server log is scrubbed as it is written (SGLang prints its ServerArgs, key
included), and so is /server_info (which lists every resolved arg).

Nothing here imports sglang: commands are built and dry-run on machines without it.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from qverify.errors import BadInput
from qverify.models import Endpoint
from qverify.quantize.kv_scales import check_sglang_scales, declared_sglang_k_scale, sglang_scales_in_dir
from qverify.serve.base import LaunchedServer, ServerBackend, backends, check_port_free, free_port
from qverify.serve.openai_http import (
    auth_headers,
    fetch_server_info,
    read_api_key,
    spec_meta,
    summarize_info,
    with_meta_info,
)
from qverify.serve.sglang_flags import FIX_PYTHON, check_sglang_imports, sglang_flags, sglang_python
from qverify.workdir import open_append

__all__ = ["SGLangBackend", "drafter_algorithm", "kv_cache_dtype", "sglang_python", "spec_meta", "with_meta_info"]

_SECRET = "__QVERIFY_API_KEY__"  # stands in for the key until the real launch
_KV_NAMES = {"fp8_e4m3", "fp8_e5m2", "mxfp8", "nvfp4", "fp4_mx_block16"}  # SGLang's non-default KV dtypes


def kv_cache_dtype(serving: dict[str, Any], manifest_kv: str | None) -> str | None:
    """SGLang's --kv-cache-dtype for a build: the recipe's implication, else the manifest's kv dtype.

    None means the model's own dtype (SGLang's "auto"), so no flag is passed.
    """
    value = str(serving.get("kv_cache_dtype") or manifest_kv or "auto").lower()
    if value in _KV_NAMES:
        return value
    if value.startswith(("fp8", "float8")):
        return "fp8_e5m2" if "e5m2" in value else "fp8_e4m3"
    return None


def drafter_algorithm(drafter: Path) -> str:
    """EAGLE3/EAGLE for a draft head, STANDALONE for a separate small model (qverify-tiny's drafter)."""
    try:
        archs = " ".join(json.loads((drafter / "config.json").read_text()).get("architectures") or [])
    except (OSError, ValueError):
        archs = ""
    if "Eagle3" in archs:
        return "EAGLE3"
    if "Eagle" in archs:
        return "EAGLE"
    return "STANDALONE"


def _weight_quantization(serving: dict[str, Any]) -> str | None:
    # the recipe's weight format; a KV-only build is detected from its config.json by SGLang itself
    return serving.get("weight_quantization") or serving.get("quantization")


class _RedactingServer(LaunchedServer):
    """A LaunchedServer whose log never holds the secrets: output is relayed through a masking thread."""

    def __init__(self, cmd: list[str], log_path: Path, secrets: list[str]):
        super().__init__(cmd, log_path)
        self.secrets = [s.encode() for s in secrets if s]
        self._relay: threading.Thread | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, env=self.env, cwd=self.cwd)
        self._relay = threading.Thread(target=self._copy, args=(self.proc.stdout,), daemon=True)
        self._relay.start()

    def _copy(self, pipe) -> None:
        with open_append(self.log_path) as log:  # never through a symlink out of the workdir (#37)
            for line in iter(pipe.readline, b""):
                for s in self.secrets:
                    line = line.replace(s, b"***")
                log.write(line)
        pipe.close()

    def stop(self, grace_s: float = 10.0) -> None:
        super().stop(grace_s)
        if self._relay:
            self._relay.join(timeout=5.0)


@backends.register("sglang")
class SGLangBackend(ServerBackend):
    name = "sglang"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self.profile.backend != "sglang":
            raise BadInput(f"profile {self.profile.name!r} is for the {self.profile.backend} backend",
                           fix="pass an sglang profile, e.g. --profile b200-tp4")
        if self.build_dir is None:
            raise BadInput("the sglang backend needs a build directory", fix="pass a build id or a build dir")
        self.flags = sglang_flags(self.profile)
        self.servers: list[LaunchedServer] = []
        self.api_key: str | None = None

    # ------------------------------------------------------------------ the command

    @property
    def served_name(self) -> str:
        return self.manifest.build_id if self.manifest else self.build_dir.name

    @property
    def bind_host(self) -> str:
        return self.flags.host or self.host

    @property
    def url_host(self) -> str:
        """Where clients reach node 0: its dist-init host when bound to all interfaces on a multi-node run."""
        if self.bind_host in ("0.0.0.0", "::"):
            if self.flags.nnodes > 1 and self.flags.dist_init_addr:
                return self.flags.dist_init_addr.rsplit(":", 1)[0]
            return "127.0.0.1"
        return self.bind_host

    def _port(self) -> int:
        if self.port is None:  # picked once, so the dry-run command is the one that would run
            self.port = free_port()
        return self.port

    def drafter_dir(self) -> Path | None:
        serving = self.manifest.serving if self.manifest else {}
        path = self.build_dir / "drafter"
        expected = bool(serving.get("requires_drafter") or (self.manifest and self.manifest.drafter))
        if (path / "config.json").is_file():
            return path
        if expected:
            raise BadInput(f"build {self.served_name} records a drafter but {path} is missing or incomplete",
                           fix="rebuild it: qverify build --recipe ... --force")
        return None

    def sglang_args(self, node_rank: int = 0) -> list[str]:
        """The launch_server argv for one node, with the API key as a placeholder."""
        f = self.flags
        serving = self.manifest.serving if self.manifest else {}
        args = [sglang_python(f.python), "-m", "sglang.launch_server",
                "--model-path", str(self.build_dir), "--served-model-name", self.served_name,
                "--tp-size", str(self.profile.tp), "--host", self.bind_host, "--port", str(self._port())]
        # Kimi's tokenizer is remote code: on when the user allowed it (flag or qverify.toml) and the build or the
        # profile asks for it; never from build.json or a profile alone
        if self.remote_code or (f.trust_remote_code and self.trust_remote_code):
            args.append("--trust-remote-code")
        args += self._format_args(serving) + self._drafter_args(serving) + self._engine_args()
        if f.nnodes > 1:
            args += ["--nnodes", str(f.nnodes), "--node-rank", str(node_rank), "--dist-init-addr", f.dist_init_addr]
        if self.profile.api_key_env:
            args += ["--api-key", _SECRET]
        return args + list(f.extra_args)

    def _format_args(self, serving: dict[str, Any]) -> list[str]:
        """The build's KV-cache dtype and weight format."""
        args = []
        kv = kv_cache_dtype(serving, self.manifest.kv_dtype if self.manifest else None)
        if kv:
            args += ["--kv-cache-dtype", kv]
        quant = _weight_quantization(serving)
        if quant:
            args += ["--quantization", quant]
        return args

    def _drafter_args(self, serving: dict[str, Any]) -> list[str]:
        """Speculative decoding with the build's drafter, when it has one and it is wanted."""
        f = self.flags
        drafter = self.drafter_dir() if f.use_drafter else None
        if not drafter:
            return []
        algo = (f.speculative_algorithm or serving.get("speculative_algorithm") or drafter_algorithm(drafter)).upper()
        args = ["--speculative-algorithm", algo, "--speculative-draft-model-path", str(drafter)]
        # SGLang gives the draft the target's --quantization unless told otherwise; a bf16 drafter
        # next to a compressed-tensors target must say "unquant" or it fails to load.
        draft_quant = serving.get("draft_model_quantization") or ("unquant" if _weight_quantization(serving) else None)
        if draft_quant:
            args += ["--speculative-draft-model-quantization", draft_quant]
        if f.speculative_num_steps is not None:
            args += ["--speculative-num-steps", str(f.speculative_num_steps),
                     "--speculative-eagle-topk", str(f.speculative_eagle_topk),
                     "--speculative-num-draft-tokens", str(f.speculative_num_draft_tokens)]
        return args

    def _engine_args(self) -> list[str]:
        """The cache, parser, seed, memory and metrics flags the profile or the command line set."""
        f = self.flags
        args = []
        if f.enable_hierarchical_cache:
            args.append("--enable-hierarchical-cache")
            if f.hicache_ratio is not None:
                args += ["--hicache-ratio", str(f.hicache_ratio)]
        for flag, value in (("--tool-call-parser", f.tool_call_parser), ("--reasoning-parser", f.reasoning_parser),
                            ("--random-seed", f.random_seed), ("--mem-fraction-static", f.mem_fraction_static),
                            ("--context-length", f.context_length)):
            if value is not None:
                args += [flag, str(value)]
        if f.enable_deterministic_inference:
            args.append("--enable-deterministic-inference")
        if f.enable_metrics:
            args.append("--enable-metrics")
        return args

    def _rendered(self, node_rank: int) -> str | list[str]:
        argv = self.sglang_args(node_rank)
        prefix = self.profile.command_prefix
        if not prefix:
            return argv
        return prefix.format(cmd=shlex.join(argv), node_rank=node_rank, nnodes=self.flags.nnodes)

    def node_commands(self, secret: str | None = None) -> list[list[str]]:
        """One argv per node (the launcher prefix applied); `secret` replaces the key placeholder."""
        out = []
        for rank in range(self.flags.nnodes):
            r = self._rendered(rank)
            argv = shlex.split(r) if isinstance(r, str) else r
            out.append([a.replace(_SECRET, secret) if secret is not None else a for a in argv])
        return out

    def redacted_command(self) -> list[str]:
        """Node 0's command as recorded in manifests: the key shows as ${VAR}."""
        return self.node_commands(secret=f"${{{self.profile.api_key_env}}}")[0]

    def command(self) -> list[str]:
        return self.redacted_command()

    def shell_lines(self) -> list[str]:
        """What --dry-run prints: one runnable shell line per node, the key read from its variable."""
        lines = []
        for rank in range(self.flags.nnodes):
            r = self._rendered(rank)
            line = r if isinstance(r, str) else shlex.join(r)
            lines.append(line.replace(_SECRET, f'"${{{self.profile.api_key_env}}}"'))
        return lines

    # ------------------------------------------------------------------ the lifecycle

    @property
    def root_url(self) -> str:
        host = f"[{self.url_host}]" if ":" in self.url_host else self.url_host
        return f"http://{host}:{self._port()}"

    def start(self) -> Endpoint:
        self.api_key = read_api_key(self.profile.api_key_env)
        check_sglang_scales(sglang_scales_in_dir(self.build_dir), self.served_name, declared_sglang_k_scale(self.build_dir))
        if not self.profile.command_prefix:  # (a launcher prefix runs it on other nodes: nothing to check here)
            check_sglang_imports(sglang_python(self.flags.python))
        if self.port is not None and not self.profile.command_prefix:
            check_port_free(self.port, self.bind_host)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for rank, argv in enumerate(self.node_commands(secret=self.api_key or "")):
            suffix = f"-node{rank}" if self.flags.nnodes > 1 else ""
            log = self.logs_dir / f"sglang-{self.served_name}-{stamp}{suffix}.log"
            server = _RedactingServer(argv, log, [self.api_key or ""])
            try:
                server.start()
            except OSError as e:
                self.stop()
                raise BadInput(f"cannot launch {argv[0]}: {e.strerror}", fix=FIX_PYTHON) from None
            self.servers.append(server)
        self.endpoint = Endpoint(base_url=f"{self.root_url}/v1", model=self.served_name, api_key=self.api_key or "EMPTY")
        return self.endpoint

    @property
    def log_path(self) -> Path | None:
        return self.servers[0].log_path if self.servers else None

    def wait_ready(self, timeout: float | None = None) -> None:
        # weights load and CUDA graphs capture before /health_generate answers: the profile's ready_timeout_s
        timeout = self.flags.ready_timeout_s if timeout is None else timeout
        self.servers[0].wait_http(f"{self.root_url}/health_generate", timeout, headers=auth_headers(self.api_key))

    def info(self) -> dict[str, Any]:
        raw = fetch_server_info(self.root_url, auth_headers(self.api_key), [self.api_key or ""])
        if raw and self.log_path:  # the full resolved config, for provenance next to the log
            self.log_path.with_suffix(".server_info.json").write_text(json.dumps(raw, indent=1, default=str))
        return summarize_info(raw)

    def alive(self) -> bool:
        return bool(self.servers) and all(s.alive() for s in self.servers)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self.servers = []
