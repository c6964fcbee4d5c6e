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
import json
import os
import re
import shlex
import threading
from typing import Any
from urllib.parse import quote, quote_plus, unquote

MASK = "***"
MIN_LEN = 4  # shorter values would mask ordinary text; no real key is this short
_USERINFO = re.compile(r"([a-z][a-z0-9+.-]*://)[^/\s@]+@", re.IGNORECASE)
# userinfo at the start of an authority, with or without a scheme: group 2 is `user[:password]`
_ANY_USERINFO = re.compile(r"^([a-z][a-z0-9+.-]*://)?([^/?#\s]+)@", re.IGNORECASE)  # up to the last @, as urlsplit
# a URL's `user:password@` (with or without a scheme): group 1 up to the password
_PASSWORD = re.compile(r"((?:[a-z][a-z0-9+.-]*://)?[^/\s:@]+):[^/\s@]+@", re.IGNORECASE)
_secrets: set[str] = set()
_lock = threading.Lock()


def register(value: str | None) -> None:
    """Scrub `value` from everything written from now on (in this process), in every form a server may echo it."""
    if value and len(value) >= MIN_LEN:
        forms = {value, *encodings(value)}
        with _lock:
            _secrets.update(f for f in forms if len(f) >= MIN_LEN)


def encodings(value: str) -> set[str]:
    """How a server or proxy may echo `value` back: JSON-escaped (also PHP's `\\/` and `\\uXXXX`), percent-encoded
    (upper- or lower-case hex, `+` for spaces), and base64 of any of these (standard and URL-safe), also as part
    of a longer encoded string (a whole header or JSON body): the characters that depend on the secret alone, at
    each of the three byte offsets."""
    escaped = json.dumps(value)[1:-1]
    forms = {escaped, escaped.replace("/", "\\/"), json.dumps(value, ensure_ascii=False)[1:-1]}
    for encoded in (quote(value, safe=""), quote(value), quote_plus(value)):
        forms |= {encoded, re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), encoded)}
    for text in list(forms | {value}):  # base64 of any of them: a JSON body or a header, encoded whole
        raw = text.encode()
        for offset, skip in ((0, 0), (1, 2), (2, 3)):  # leading bytes of the container, and the chars they touch
            whole = base64.b64encode(b"\0" * offset + raw).decode()
            core = whole[skip:(offset + len(raw)) // 3 * 4]
            if len(core) >= 2 * MIN_LEN:  # shorter cores would mask ordinary base64 text
                forms |= {core, core.replace("+", "-").replace("/", "_")}
    return forms


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


def masked_command(argv: list[str]) -> str:
    """`argv` as one shell line that still reads as the command, with URL passwords and registered secrets
    masked (`user:***@`): for lines printed to the terminal, such as the Ctrl-C "resume with ..." line."""
    line = _PASSWORD.sub(rf"\1:{MASK}@", shlex.join(argv))
    for s in secrets():
        line = line.replace(s, MASK)
    return line


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
