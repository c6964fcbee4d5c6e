"""Serving backends behind one lifecycle: local (embedded CPU server), sglang (production), endpoint (attach)."""

from qverify.serve import endpoint, local, sglang  # noqa: F401  (importing registers the backends)
from qverify.serve.base import LaunchedServer, ServerBackend, backends, free_port


def get_backend(name: str) -> type[ServerBackend]:
    """A backend class by name (importing this package registered them all); unknown names get "did you mean"."""
    return backends.get(name)


__all__ = ["LaunchedServer", "ServerBackend", "backends", "free_port", "get_backend"]
