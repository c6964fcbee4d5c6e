"""HTTP helpers every backend shares, for OpenAI-compatible servers (SGLang, qverify's local one, routers).

The readiness probe, server-info capture (trimmed, with secrets scrubbed), API-key handling and
SGLang's per-request `meta_info`.
"""

from __future__ import annotations

import os
from typing import Any

import httpx

from qverify.errors import BadInput
from qverify.scrub import register, shown_url

# The first of these the server has decides. SGLang's /health_generate runs a one-token
# generation, so 200 there means the model answers, not merely that the port is open.
READY_PATHS = ("/health_generate", "/health", "/v1/models")
INFO_PATHS = ("/server_info", "/get_server_info")
# SGLang's /server_info carries every resolved server arg (hundreds); these are the ones a result depends on.
SGLANG_INFO_KEYS = (
    "version", "model_path", "served_model_name", "tp_size", "dp_size", "nnodes", "quantization", "kv_cache_dtype",
    "speculative_algorithm", "speculative_draft_model_path", "speculative_draft_model_quantization",
    "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens", "context_length",
    "mem_fraction_static", "max_total_num_tokens", "max_running_requests", "enable_hierarchical_cache",
    "hicache_ratio", "enable_deterministic_inference", "random_seed", "attention_backend", "tool_call_parser",
    "reasoning_parser", "launch_command",
)
SPEC_META_KEYS = ("spec_accept_length", "spec_verify_ct", "spec_accept_rate", "prompt_tokens", "completion_tokens",
                  "cached_tokens", "e2e_latency")
REDACTED = "***"
KEY_ENV = "QVERIFY_SERVER_KEY"  # the embedded server's per-launch key: in its environment, which other users
# cannot read (its argv they can)


def root_url(url: str) -> str:
    """http://host:port from a URL given with or without a trailing /v1."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def read_api_key(env_var: str | None) -> str | None:
    """The key from the named environment variable; the key itself is never a flag or a profile value."""
    if not env_var:
        return None
    key = os.environ.get(env_var)
    if not key:
        raise BadInput(f"environment variable {env_var} (the API key) is not set",
                       fix=f"export {env_var}=<key>, or point --api-key-env at the variable that holds it")
    register(key)  # scrubbed from every result, manifest and log written from now on (qverify.scrub)
    return key


def probe_ready(root: str, headers: dict[str, str], timeout: float = 30.0) -> tuple[bool, str]:
    """(ready, what answered). Paths the server lacks (404/405) are skipped; 401/403 is bad input."""
    for path in READY_PATHS:
        try:
            r = httpx.get(root + path, headers=headers, timeout=timeout)
        except httpx.HTTPError as e:
            return False, f"GET {path}: {type(e).__name__}"
        if r.status_code in (401, 403):
            raise BadInput(f"{shown_url(root)}{path} refused the API key (HTTP {r.status_code})",
                           fix="set --api-key-env to the variable that holds the server's key")
        if r.status_code in (404, 405):
            continue
        return r.status_code == 200, f"GET {path}: HTTP {r.status_code}"
    return False, f"none of {', '.join(READY_PATHS)} exists"


def scrub(obj: Any, secrets: list[str]) -> Any:
    """Drop api-key fields and mask secret values anywhere in a JSON-like object."""
    if isinstance(obj, dict):
        return {k: (REDACTED if "api_key" in str(k).lower() and v else scrub(v, secrets)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [scrub(v, secrets) for v in obj]
    if isinstance(obj, str):
        for s in secrets:
            if s:
                obj = obj.replace(s, REDACTED)
    return obj


def fetch_server_info(root: str, headers: dict[str, str], secrets: list[str]) -> dict[str, Any]:
    """The server's own info, scrubbed; {} when it has no info endpoint."""
    for path in INFO_PATHS:
        try:
            r = httpx.get(root + path, headers=headers, timeout=30.0)
        except httpx.HTTPError:
            return {}
        if r.status_code == 200:
            try:
                raw = r.json()
            except ValueError:
                return {}
            return scrub(raw, secrets) if isinstance(raw, dict) else {}
    return {}


def summarize_info(raw: dict[str, Any]) -> dict[str, Any]:
    """The fields a result depends on, plus internal_states[0].avg_spec_accept_length flattened.

    SGLang's info (recognised by `launch_command`) is cut to SGLANG_INFO_KEYS; a smaller server
    (qverify's local one, a router) keeps all its scalar fields.
    """
    scalar = (str, int, float, bool, type(None))
    keys = [k for k in SGLANG_INFO_KEYS if k in raw] if "launch_command" in raw else list(raw)
    out = {k: raw[k] for k in keys if isinstance(raw[k], scalar)}
    states = [s for s in raw.get("internal_states") or [] if isinstance(s, dict)]
    if states:
        out["internal_states"] = [{k: v for k, v in s.items() if isinstance(v, scalar)} for s in states]
        out["avg_spec_accept_length"] = states[0].get("avg_spec_accept_length")
    return out


def with_meta_info(body: dict[str, Any]) -> dict[str, Any]:
    """Ask an SGLang-compatible server for per-request meta_info (non-streaming only)."""
    return {**body, "return_meta_info": True, "stream": False}


def spec_meta(response: dict[str, Any], index: int = 0) -> dict[str, Any]:
    """spec_accept_length, spec_verify_ct, token counts from choices[index].meta_info ({} if absent)."""
    choices = response.get("choices") or []
    meta = (choices[index].get("meta_info") if len(choices) > index else None) or {}
    return {k: meta[k] for k in SPEC_META_KEYS if k in meta}
