"""What the engine holds per prompt and per running sequence (engine.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from qverify.serve.embedded.request import GenRequest, GenResult
from qverify.serve.embedded.runner import PromptKV


@dataclass
class Prompt:
    ids: tuple[int, ...]
    kv: PromptKV | None = None
    draft_kv: PromptKV | None = None
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
    hit: bool = False  # takes its prompt's radix-hit view (Engine._take_hits)

    @property
    def last(self) -> int:
        return self.tokens[-1]
