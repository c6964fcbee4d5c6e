"""qverify: verify lossy LLM serving builds against the serving stack's own nondeterminism."""

__version__ = "0.1.0"
