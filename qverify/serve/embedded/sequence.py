"""The engine's bookkeeping for one prompt (shared by its replicates) and one generating sequence."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from qverify.serve.embedded.request import GenRequest, GenResult
from qverify.serve.embedded.sampler import batch_params


class Aborted(Exception):
    """The client went away: the engine dropped its sequence (SGLang's abort_request on disconnect)."""


@dataclass
class Prompt:
    ids: tuple[int, ...]
    kv: Any = None  # runner.PromptKV
    draft_kv: Any = None
    eagle: Any = None  # the EAGLE3 head's rows for this prompt (eagle3_draft.PromptRows)
    last_logits: torch.Tensor | None = None
    logp: torch.Tensor | None = None  # [P, V] log-softmax at every position, when echo was asked for
    echo_rows: dict[int, list] = field(default_factory=dict)  # top-k -> echo logprob rows, built once per prompt
    users: int = 0
    serial: int = 0  # admission order: a stable order for the prompts' table (split_kv.PromptPlan)
    # a radix hit's view of this prompt (prefix_reads.py): the same ids, the cached prefix read back from the FP8
    # pool, its own last rows and logits; `base` is the prompt it was read from (users are counted there)
    hit: Prompt | None = None
    base: Prompt | None = None


@dataclass
class Seq:
    req: GenRequest
    done: Callable[[GenResult | None, BaseException | None], None]
    seed: int
    prompt: Prompt | None = None
    tokens: list[int] = field(default_factory=list)  # emitted (an EOS included)
    lps: list[dict[str, Any]] = field(default_factory=list)
    gen_len: int = 0  # rows in the target's gen slot
    draft_len: int = 0
    draft_pending: list[int] = field(default_factory=list)  # emitted tokens the drafter has not seen yet
    verify_ct: int = 0
    eagle: Any = None  # the EAGLE3 head's state for this sequence (eagle3_draft.SeqDraft)
    finish: str | None = None
    # what this sequence alone raised inside a batch step (its sampling row, its stop check, its stream callback):
    # it leaves the batch at the step's end and its request gets the error; the others go on
    error: BaseException | None = None
    hit: bool = False  # takes its prompt's radix-hit view (prefix_reads.take_hits)

    @property
    def last(self) -> int:
        return self.tokens[-1]

    def fail(self, exc: BaseException) -> None:
        self.error, self.finish = exc, "error"


def sampling_params(seqs: list[Seq], vocab: int) -> tuple:
    """The sampler's per-row parameters (sampler.batch_params). A row that cannot be built (a seed past int64 that
    got past check_request) fails its own sequence, whose row then samples greedily until it leaves the batch."""
    row = lambda s: (s.req.temperature, s.req.top_p, s.seed, s.req.bad_token_ids) if s.error is None else (0.0, 1.0, 0, [])
    try:
        return batch_params([row(s) for s in seqs], vocab)
    except Exception:  # noqa: BLE001 - found row by row below, then reported to that row's request only
        for s in seqs:
            try:
                batch_params([row(s)], vocab)
            except Exception as e:  # noqa: BLE001 - this sequence's own failure
                s.fail(e)
        return batch_params([row(s) for s in seqs], vocab)
