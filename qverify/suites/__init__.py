"""Suites, discoverable by name: `qverify suites list`. Importing this package registers them all."""

from qverify.suites import coding, greedy, kld, lmeval, longctx, toolcall, verifier  # noqa: F401
from qverify.suites.base import Suite, get_suite, suites

__all__ = ["Suite", "get_suite", "suites"]
