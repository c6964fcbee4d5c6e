"""Serving backends behind one lifecycle: local (embedded CPU server), sglang (production), endpoint (attach)."""

from qverify.serve.base import LaunchedServer, ServerBackend, backends, free_port, get_backend

for _mod in ("local", "sglang", "endpoint"):
    try:
        __import__(f"qverify.serve.{_mod}")
    except ModuleNotFoundError as _e:  # a backend still being written must not break the others
        if _e.name != f"qverify.serve.{_mod}":
            raise

__all__ = ["LaunchedServer", "ServerBackend", "backends", "free_port", "get_backend"]
