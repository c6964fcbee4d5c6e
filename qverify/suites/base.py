"""A suite = items + request + scorer + metrics, in one file per suite (inspect_ai's shape).

Suites register by name with `@suites.register("name")`. Scorers never raise on model
output: a malformed response is a scored failure with a reason.
"""

from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from qverify.errors import InfraError
from qverify.models import (
    Endpoint,
    Item,
    ItemResult,
    Response,
    Sampling,
    Score,
    Split,
    canonical_split,  # noqa: F401  (re-exported: the suites import it from here)
    content_hash,
)
from qverify.registry import Registry
from qverify.suites.metric_spec import MetricSpec

TokenCounter = Callable[[str], int]

# Of each generator's key space: test [0, 0.1), validation [0.1, 0.2), train the rest. The train
# share is the one the first qverify-tiny was trained on (held-out was [0, 0.2)), so a model
# warm-started from it has seen no validation or test key.
TEST_FRACTION = 0.1
VALIDATION_FRACTION = 0.1


def split_of(key: str) -> Split:
    """Assign a generated item to a split by hashing its identity key.

    Generators draw candidates from one seeded stream and keep only those whose
    key hashes into the requested split, so the splits are disjoint by
    construction, whatever the seeds. Coding's key is the program's behaviour
    (coding_check.signature), so items that behave alike share a split.
    """
    h = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 1000
    if h < TEST_FRACTION * 1000:
        return "test"
    return "validation" if h < (TEST_FRACTION + VALIDATION_FRACTION) * 1000 else "train"


def split_rng(suite: str, split: Split, seed: int) -> random.Random:
    return random.Random(f"{suite}:{split}:{seed}")


def approx_tokens(text: str) -> int:
    """Fallback token count when no tokenizer is given: ~3.2 characters per token for code-like text, a rule of
    thumb (BPE tokenizers give 3-4 on English and code), not measured here; suites that size prompts by tokens get
    the build's real tokenizer (pipeline.token_counter) whenever a build is evaluated."""
    return max(1, round(len(text) / 3.2))


class Suite(ABC):
    """Base for every suite. Subclasses set the ClassVars and implement items() and score()."""

    name: ClassVar[str]
    version: ClassVar[str]
    description: ClassVar[str]
    primary_metric: ClassVar[str]
    sampling: ClassVar[Sampling] = Sampling()
    sources: ClassVar[tuple[str, ...]] = ("synthetic",)
    default_n: ClassVar[int] = 40  # test items used by default for the embedded model
    pairwise: ClassVar[bool] = False  # metrics computed against the baseline at gate time (verifier, kld)
    gate_metrics: ClassVar[tuple[MetricSpec, ...]] = ()  # what the gate decides on, declared with the suite

    runs_model_code: ClassVar[bool] = False  # True: scoring executes model output (needs the sandbox)
    # True: the suite sends and scores its own requests through run() (lmeval:<task>: lm-eval does both);
    # the runner (qverify.evals.runner.run_plan) calls run() per replicate instead of request() + score() per item
    runs_itself: ClassVar[bool] = False

    def __init__(self, count_tokens: TokenCounter | None = None, **options: Any):
        self.count_tokens = count_tokens or approx_tokens
        self.options = options
        self.allow_unsandboxed = False  # set by the eval plan from --allow-unsandboxed / qverify.toml

    # -- items ---------------------------------------------------------------
    @abstractmethod
    def items(self, split: Split = "test", n: int | None = None, seed: int = 0, source: str = "synthetic") -> list[Item]:
        """Deterministic items for (split, n, seed, source)."""

    def item_counts(self) -> dict[str, str]:
        return {src: "generated" if src == "synthetic" else "?" for src in self.sources}

    def answer_text(self, item: Item) -> str:
        """What a perfect model answers to a generated item (training and calibration text)."""
        raise NotImplementedError(f"suite {self.name} has no reference answers")

    # -- request ---------------------------------------------------------------
    def sent_sampling(self, sampling: Sampling | None = None) -> Sampling:
        """The sampling requests carry: the suite's, with the serving profile's per-model output budget (a thinking
        model needs far more than the suite's default). What a run manifest records and a resumed run must match."""
        s = sampling or self.sampling
        budget = self.options.get("max_tokens") if s.max_tokens > 1 else None  # kld scores 1 token
        return s.model_copy(update={"max_tokens": budget}) if budget else s

    def request(self, item: Item, sampling: Sampling | None = None) -> dict[str, Any]:
        """OpenAI-compatible request body (without `model`) for one item."""
        s = self.sent_sampling(sampling)
        body: dict[str, Any] = {"temperature": s.temperature, "top_p": s.top_p, "max_tokens": s.max_tokens}
        if s.stop:
            body["stop"] = s.stop
        if item.kind == "completion":
            body["prompt"] = item.prompt
            if s.logprobs:
                body.update(echo=True, logprobs=s.top_logprobs or 5)
        else:
            body["messages"] = item.messages
            if self.options.get("chat_template_kwargs"):  # e.g. Kimi K2.x thinking off for gating
                body["chat_template_kwargs"] = dict(self.options["chat_template_kwargs"])
            if item.tools:
                body["tools"] = item.tools
            if s.logprobs:
                body.update(logprobs=True, top_logprobs=s.top_logprobs or 5)
        return body

    # -- scoring ---------------------------------------------------------------
    @abstractmethod
    def score(self, item: Item, response: Response) -> Score:
        """Score one response. Must not raise on any model output."""

    def run(self, endpoint: Endpoint, replicate: int = 0, seed: int = 0, limit: int | None = None) -> list[ItemResult]:
        """One replicate of every item (the first `limit`), requested and scored by the suite itself (runs_itself)."""
        raise NotImplementedError(f"suite {self.name} is run item by item (runs_itself is False)")

    def safe_score(self, item: Item, response: Response) -> Score:
        try:
            return self.score(item, response)
        except InfraError:  # e.g. no sandbox: not the model's fault, so never a scored failure
            raise
        except Exception as e:  # noqa: BLE001 -- a scorer bug must not kill a run; it is a scored failure with the reason
            return Score(values={self.primary_metric: 0.0}, reason=f"scorer error: {type(e).__name__}: {e}")


def item_set_hash(items: list[Item]) -> str:
    return content_hash(sorted(i.id for i in items))


suites: Registry[type[Suite]] = Registry("suite")

