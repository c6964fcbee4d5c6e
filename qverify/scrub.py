"""The secrets this process holds, and the one function that takes them out of what it writes.

A secret is registered where it enters (the value of the variable `--api-key-env` names, when the key is
read; the password of an endpoint URL's `user:pass@`), and everything written to disk passes through
`scrub_text` / `scrub_obj`: run results (runs/*.jsonl: an error body can echo the key), run manifests,
server and endpoint logs, qverify's own log. The report's redaction (qverify.reports.redact) starts from
the same set, so the parquet and MLflow artifacts, copied from those files, hold no secret either.
URLs are recorded and logged without their userinfo (`shown_url`).
"""

from __future__ import annotations

import base64
import os
import re
import threading
from typing import Any
from urllib.parse import unquote

MASK = "***"
MIN_LEN = 4  # shorter values would mask ordinary text; no real key is this short
_USERINFO = re.compile(r"([a-z][a-z0-9+.-]*://)[^/\s@]+@", re.IGNORECASE)
# userinfo at the start of an authority, with or without a scheme: group 2 is `user[:password]`
_ANY_USERINFO = re.compile(r"^([a-z][a-z0-9+.-]*://)?([^/?#\s]+)@", re.IGNORECASE)  # up to the last @, as urlsplit
_secrets: set[str] = set()
_lock = threading.Lock()


def register(value: str | None) -> None:
    """Scrub `value` from everything written from now on (in this process)."""
    if value and len(value) >= MIN_LEN:
        with _lock:
            _secrets.add(value)


def register_env(name: str | None) -> None:
    """Register the value of the environment variable `name` (an `--api-key-env`), when set."""
    if name:
        register(os.environ.get(name))


def secrets() -> list[str]:
    """Registered values, longest first (a key that contains another is masked whole)."""
    with _lock:
        return sorted(_secrets, key=len, reverse=True)


def scrub_text(text: str) -> str:
    """`text` with every registered secret masked and every URL's `user:pass@` removed. A secret cut off at
    the end of `text` (an error body kept to its first 300 characters) is masked too: its start is still secret."""
    for s in secrets():
        if s in text:
            text = text.replace(s, MASK)
        for k in range(len(s) - 1, MIN_LEN - 1, -1):
            if text.endswith(s[:k]):
                text = text[:-k] + MASK
                break
    return _USERINFO.sub(r"\1", text) if "@" in text else text


def scrub_obj(obj: Any) -> Any:
    """A JSON-able copy with every string scrubbed."""
    if isinstance(obj, dict):
        return {k: scrub_obj(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub_obj(v) for v in obj]
    if isinstance(obj, str):
        return scrub_text(obj)
    return obj


def shown_url(url: str | None) -> str | None:
    """`url` without `user:pass@` (its password registered as a secret): what logs, messages and manifests hold.
    Also for a URL urlsplit refuses (a bad IPv6 host) or one without a scheme (`user:pass@host`), so an error
    message that quotes a bad --endpoint never shows its password."""
    if not url:
        return url
    m = _ANY_USERINFO.match(url)
    if m is None:
        return url
    user, _, password = m.group(2).partition(":")
    for pw, name in ((password, user), (unquote(password), unquote(user))):  # httpx sends them percent-decoded
        register(pw)
        if name and pw:  # as Basic auth, which a server may echo back
            register(base64.b64encode(f"{name}:{pw}".encode()).decode())
    return url[:m.start(2)] + url[m.end():]
