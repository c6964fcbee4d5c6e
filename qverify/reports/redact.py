"""Keep secrets out of MLflow: every param, tag and text artifact passes through here.

Three nets, because no single one catches everything a server log or a serving
profile can carry:
1. keys that name a secret (`api_key`, `HF_TOKEN`, `--api-key`) get their value masked;
2. values that look like a credential (sk-…, hf_…, ghp_…, AKIA…, JWTs, Bearer …,
   user:pass@ in URLs) are masked wherever they appear;
3. the literal values of this process's secret-looking environment variables are
   masked wherever they appear (a key pasted into a log line under no recognisable name).
"""

from __future__ import annotations

import os
import re
from typing import Any

MASK = "***"

# `token` alone is too broad ("kv_bytes_per_token", "max_tokens"): it counts only as
# the whole key or behind a prefix that makes it a credential.
_SECRET_KEY = re.compile(
    r"(?i)(api[-_]?key|secret|passw(or)?d|credential|private[-_]?key|access[-_]?key|authorization"
    r"|(^|[-_.])(access|auth|bearer|hf|api|session|refresh|github|gh|openai|slack|id)[-_]?token$|^token$|^auth$)"
)
_SECRET_VALUE = re.compile(
    r"(sk-[A-Za-z0-9_\-]{16,}|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,})"
)
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/\-]{8,}=*")
_URL_USERINFO = re.compile(r"([a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@")
# KEY=value, "key": "value", --flag value, --flag=value; the key decides.
_ASSIGNMENT = re.compile(r"""([A-Za-z0-9_.\-]+)(["']?\s*[=:]\s*["']?|\s+)([^\s"',;]{4,})""")
_ENV_NAME = re.compile(r"(?i)(key|token|secret|pass|credential|auth)")


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key.lstrip("-")))


_env_cache: list[str] | None = None


def refresh() -> None:
    """Re-read the environment (each stage and upload starts with this; reading it per string is slow)."""
    global _env_cache
    _env_cache = None


def _env_secrets() -> list[str]:
    """Values of secret-named environment variables, longest first (so substrings don't win)."""
    global _env_cache
    if _env_cache is None:
        vals = {
            v for k, v in os.environ.items()
            if _ENV_NAME.search(k) and len(v) >= 8 and not v.startswith(("/", "~", "."))
            and v.lower() not in {"true", "false", "none", "null"} and not v.isdigit()
        }
        _env_cache = sorted(vals, key=len, reverse=True)
    from qverify.scrub import secrets

    return sorted({*_env_cache, *secrets()}, key=len, reverse=True)  # + keys this process registered (--api-key-env)


def redact_text(text: str) -> str:
    if not text:
        return text
    for val in _env_secrets():
        text = text.replace(val, MASK)
    text = _URL_USERINFO.sub(rf"\1{MASK}:{MASK}@", text)
    text = _BEARER.sub(rf"\1{MASK}", text)
    text = _SECRET_VALUE.sub(MASK, text)

    def _assign(m: re.Match[str]) -> str:
        key, sep, _ = m.groups()
        # a bare-space separator counts only for CLI flags ("--api-key X"), not prose ("token was")
        if sep.strip() == "" and not key.startswith("-"):
            return m.group(0)
        return f"{key}{sep}{MASK}" if is_secret_key(key) else m.group(0)

    return _ASSIGNMENT.sub(_assign, text)


def redact_obj(obj: Any) -> Any:
    """A JSON-able copy with secret-named keys masked and every string passed through redact_text."""
    if isinstance(obj, dict):
        return {k: (MASK if isinstance(k, str) and is_secret_key(k) and v not in (None, "") else redact_obj(v))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_obj(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


def redact_command(cmd: list[str]) -> list[str]:
    """A launch command with the value after a secret flag masked (`--api-key X`, `--api-key=X`)."""
    out: list[str] = []
    mask_next = False
    for tok in cmd:
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        if tok.startswith("-") and "=" in tok:
            flag, _ = tok.split("=", 1)
            out.append(f"{flag}={MASK}" if is_secret_key(flag) else redact_text(tok))
            continue
        mask_next = tok.startswith("-") and is_secret_key(tok)
        out.append(redact_text(tok))
    return out
