"""Suites, discoverable by name: `qverify suites list`. Importing this package registers them all.

A suite is one file: items, request, scorer and its gate metrics (`Suite.gate_metrics`).
Adding one means writing that file and importing it below (the registration).
"""

from typing import Any

from qverify.suites import coding, greedy, kld, lmeval, longctx, toolcall, verifier  # noqa: F401
from qverify.suites.base import Suite, suites
from qverify.suites.metric_spec import MetricSpec


def get_suite(name: str, **kwargs: Any) -> Suite:
    """Instantiate a suite by name. `lmeval:<task>` is routed to the lm-eval adapter."""
    if name.startswith("lmeval:"):
        cls = suites.get("lmeval")
        return cls(task=name.split(":", 1)[1], **kwargs)
    return suites.get(name)(**kwargs)


def train_examples(name: str, n: int, seed: int = 0, **options: Any) -> list[tuple[str, str]]:
    """(prompt, answer) pairs from a suite's train split, in the chat format the model sees.

    What the quantization calibration (qverify/quantize/calibration.py) and the reference-model
    trainer (qverify/reference/) learn from; neither imports the other.
    """
    from qverify.chatfmt import render_chat

    suite = get_suite(name, **options)
    return [(render_chat(i.messages, i.tools), suite.answer_text(i)) for i in suite.items("train", n, seed)]


def gate_metrics() -> list[MetricSpec]:
    """Every registered suite's gate-metric declarations, by name."""
    return sorted((spec for _, cls in suites.items() for spec in cls.gate_metrics), key=lambda s: s.name)


def suite_gate_metrics(suite: str) -> list[MetricSpec]:
    """One suite's declarations, by name; none for a suite that declares none (e.g. `lmeval:<task>`)."""
    return sorted(suites.get(suite).gate_metrics, key=lambda s: s.name) if suite in suites else []


__all__ = ["MetricSpec", "Suite", "gate_metrics", "get_suite", "suite_gate_metrics", "suites", "train_examples"]
