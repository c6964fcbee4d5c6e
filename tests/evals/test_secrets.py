"""Secrets are never stored (#31): the key `--api-key-env` names and an endpoint URL's `user:pass@` appear in
nothing qverify writes, although the server echoes them back. The real CLI against a real HTTP server
(tests/badserver.py, mode "echo")."""

from __future__ import annotations

import base64
import json
import os
import re
from urllib.parse import quote_plus

from tests.badserver import BadServer
from tests.evals.test_bad_servers import _eval, _workdir

KEY = "qv-test-key-6b1f0c2a9e"
PASSWORD = "hunter2-pass-77"


def _eval_against_echo(bf16_build, wd_parent, userinfo: str, *args: str, env: dict | None = None,
                       mode: str = "echo"):
    wd = _workdir(bf16_build, wd_parent)
    with BadServer(mode) as srv:
        r, _ = _eval(wd, bf16_build, srv.url.replace("http://", f"http://{userinfo}"), "--suites", "toolcall",
                     "--limit", "3", "--replicates", "1", *args, env=env)
    assert r.returncode == 3, r.stderr  # every item a 400: incomplete, not a crash
    files = [p for p in wd.rglob("*") if p.is_file() and not p.is_symlink() and "builds" not in p.parts]
    jsonl = [p for p in files if p.suffix == ".jsonl"]
    assert jsonl and any("***" in p.read_text() for p in jsonl)  # the echo was stored, masked
    assert any(p.name.startswith("endpoint-") for p in files)
    return r, files


def test_the_api_key_is_in_nothing_written(bf16_build, tmp_path):
    env = os.environ | {"QV_ENDPOINT_CRED": KEY}  # a name no secret-name heuristic knows
    r, files = _eval_against_echo(bf16_build, tmp_path, "", "--api-key-env", "QV_ENDPOINT_CRED", env=env)
    for p in files:
        assert KEY not in p.read_text(errors="replace"), p
    assert KEY not in r.stderr + r.stdout


def test_the_url_password_is_in_nothing_written(bf16_build, tmp_path):
    r, files = _eval_against_echo(bf16_build, tmp_path, f"alice:{PASSWORD}@")
    basic = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    for p in files:
        text = p.read_text(errors="replace")
        assert PASSWORD not in text and "alice" not in text and basic not in text, p  # manifest, results, logs
        assert PASSWORD not in p.name and "alice" not in p.name  # the endpoint log's name
    assert PASSWORD not in r.stderr + r.stdout


def test_registered_secrets_reach_the_report_redaction():
    from qverify.reports.redact import redact_obj
    from qverify.scrub import register, scrub_text

    # the parquet and MLflow artifacts pass through redact_obj: it masks what qverify registered, under any name
    register("zz-unnamed-credential-42")
    row = {"error_detail": "invalid key zz-unnamed-credential-42", "url": "https://bob:pw1234@h.example/v1"}
    out = redact_obj(row)
    assert "zz-unnamed-credential-42" not in str(out) and "pw1234" not in str(out)
    assert scrub_text("see https://bob:pw1234@h.example/v1") == "see https://h.example/v1"


def test_a_percent_encoded_password_is_in_nothing_written(bf16_build, tmp_path):
    """A password with `$`, `:` or `@` must be percent-encoded in a URL; httpx decodes it before sending Basic auth,
    so the decoded form and its base64 are what a server echoes (the hostile pass found both stored)."""
    from urllib.parse import quote

    raw = "Pa$$w0rd:@9x"
    r, files = _eval_against_echo(bf16_build, tmp_path, f"alice:{quote(raw, safe='')}@")
    basic = base64.b64encode(f"alice:{raw}".encode()).decode()
    for p in files:
        text = p.read_text(errors="replace")
        assert raw not in text and basic not in text and quote(raw, safe="") not in text, p
    assert raw not in r.stderr + r.stdout


def test_no_message_shows_an_endpoint_password(bf16_build, tmp_path):
    """`serve --dry-run` printed the URL as given; a URL without a scheme was quoted whole in its error; a bad
    IPv6 host crashed as "a bug in qverify" (exit 3). Each now shows the URL without `user:pass@`, and a bad URL
    is exit 4 before anything runs."""
    import subprocess
    import sys

    wd = _workdir(bf16_build, tmp_path)

    def serve(url: str):
        return subprocess.run([sys.executable, "-m", "qverify", "--workdir", str(wd), "serve", bf16_build.manifest.build_id,
                               "--backend", "endpoint", "--endpoint", url, "--dry-run"],
                              capture_output=True, text=True, timeout=120, check=False)

    r = serve(f"http://alice:{PASSWORD}@127.0.0.1:9/v1")
    assert r.returncode == 0 and "127.0.0.1:9" in r.stdout, r.stderr
    assert PASSWORD not in r.stdout + r.stderr
    for bad in (f"alice:{PASSWORD}@127.0.0.1:9/v1", f"http://alice:{PASSWORD}@[::1/v1", f"http://alice:{PASSWORD}@h:99999/v1"):
        r = serve(bad)
        assert r.returncode == 4, (bad, r.stderr)
        assert "not an http(s) URL" in r.stderr and PASSWORD not in r.stdout + r.stderr, r.stderr
    for bad in (f"alice:{PASSWORD}@127.0.0.1:9/v1", f"http://alice:{PASSWORD}@[::1/v1"):
        r, _ = _eval(wd, bf16_build, bad, "--suites", "toolcall", "--limit", "1", timeout=120)
        assert r.returncode == 4 and PASSWORD not in r.stdout + r.stderr, r.stderr


def test_a_key_echoed_encoded_is_in_nothing_written(bf16_build, tmp_path):
    """#37: a key with `/` echoed JSON-escaped as `\\/` (PHP's json_encode), percent-encoded or base64 was stored."""
    from urllib.parse import quote

    key = "qv/slash+key=9z/7Qx"
    env = os.environ | {"QV_ENDPOINT_CRED": key}
    r, files = _eval_against_echo(bf16_build, tmp_path, "", "--api-key-env", "QV_ENDPOINT_CRED", env=env,
                                  mode="echoenc")
    forms = {key, key.replace("/", "\\/"), quote(key, safe=""), base64.b64encode(f"Bearer {key}".encode()).decode(),
             base64.b64encode(key.encode()).decode()}
    for p in files:
        text = p.read_text(errors="replace")
        assert not [f for f in forms if f in text], p
    assert not [f for f in forms if f in r.stderr + r.stdout]


def test_every_encoding_of_a_secret_is_masked():
    from urllib.parse import quote

    from qverify.scrub import register, scrub_text

    secret = "pw/\u00e9 +x:9Kq~"  # slash, a non-ASCII char, a space, a plus
    register(secret)
    blob = {"auth": f"Basic {secret}", "n": 1}
    echoes = [json.dumps(secret), json.dumps(secret).replace("/", "\\/"), json.dumps(secret, ensure_ascii=False),
              quote(secret, safe=""), re.sub("%[0-9A-F]{2}", lambda m: m.group().lower(), quote(secret, safe="")), quote(secret), quote_plus(secret),
              base64.b64encode(secret.encode()).decode(), base64.urlsafe_b64encode(secret.encode()).decode()]
    echoes += [base64.b64encode((pad + json.dumps(blob)).encode()).decode() for pad in ("", "x", "xy")]
    for echo in echoes:
        out = scrub_text(f"error: {echo} rejected")
        assert "***" in out and echo not in out, (echo, out)
    assert scrub_text("ordinary text, base64 aGVsbG8gd29ybGQ=") == "ordinary text, base64 aGVsbG8gd29ybGQ="


def test_the_resume_line_shows_no_password():
    from qverify.interrupt import resume_line

    argv = ["eval", "b1", "--endpoint", "http://alice:s3cret-pw@10.0.0.1:8000/v1", "--endpoint=https://bob:pw2x@h/v1"]
    line = resume_line(2, argv)
    assert "s3cret-pw" not in line and "pw2x" not in line
    assert "http://alice:***@10.0.0.1:8000/v1" in line and "https://bob:***@h/v1" in line
