"""The embedded server's generation engine: transformers generate with the build's real numerics.

Why not plain `generate(do_sample=True)`: its sampling draws from one global RNG, so a
request's output would depend on which requests shared its batch and seeds could not
be honoured. `SeededSampler` samples each row from its own `torch.Generator` inside a
logits processor (greedy then picks that token), so a seed gives the same tokens in any
batch; what still varies with batch composition is the logits' floating-point noise,
as on a GPU server.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation.streamers import BaseStreamer


@dataclass
class GenRequest:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    top_logprobs: int = 0  # 0 = no logprobs
    want_logprobs: bool = False
    bad_token_ids: list[int] = field(default_factory=list)
    on_token: Callable[[list[int]], None] | None = None  # streaming: called with each step's new token ids


@dataclass
class GenResult:
    token_ids: list[int]
    text: str
    finish_reason: str
    logprobs: list[dict[str, Any]] | None = None  # [{token, logprob, top: {tok: lp}}]
    meta_info: dict[str, Any] = field(default_factory=dict)


class SeededSampler(LogitsProcessor):
    def __init__(self, reqs: list[GenRequest], banned: list[list[int]]):
        self.reqs = reqs
        self.banned = banned
        self.gens = []
        for r in reqs:
            g = torch.Generator()
            g.manual_seed(r.seed if r.seed is not None else torch.seed())
            self.gens.append(g)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = scores.float().clone()
        for i, r in enumerate(self.reqs):
            if self.banned[i]:
                scores[i, self.banned[i]] = -math.inf
            if r.temperature <= 0:
                continue
            probs = torch.softmax(scores[i] / r.temperature, dim=-1)
            if r.top_p < 1.0:
                sp, si = torch.sort(probs, descending=True)
                keep = torch.cumsum(sp, 0) - sp < r.top_p
                mask = torch.zeros_like(probs, dtype=torch.bool)
                mask[si[keep]] = True
                probs = torch.where(mask, probs, torch.zeros_like(probs))
                probs = probs / probs.sum()
            tok = torch.multinomial(probs, 1, generator=self.gens[i])
            row = torch.full_like(scores[i], -math.inf)
            row[tok] = 0.0
            scores[i] = row
        return scores


class _TokenStreamer(BaseStreamer):
    """transformers' streamer hook, forwarding new token ids (the first `put` is the prompt)."""

    def __init__(self, on_token: Callable[[list[int]], None]):
        self.on_token = on_token
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.on_token(value.reshape(-1).tolist())

    def end(self) -> None:
        pass


def _top(logp: torch.Tensor, k: int, tok) -> dict[str, float]:
    if k <= 0:
        return {}
    v, i = torch.topk(logp, k)
    return {tok.convert_ids_to_tokens(int(t)): float(x) for x, t in zip(v, i)}


class Engine:
    """Runs batches of GenRequests on one model (and optionally a drafter, batch 1)."""

    def __init__(self, model, tokenizer, drafter=None):
        self.model = model
        self.tok = tokenizer
        self.drafter = drafter
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self.forwards = 0
        model.register_forward_hook(lambda *a: setattr(self, "forwards", self.forwards + 1))
        self.spec_tokens = 0
        self.spec_verify = 0

    @property
    def max_context(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))

    @torch.no_grad()
    def prompt_logprobs(self, ids: list[int], k: int) -> list[dict[str, Any]]:
        """Per-prompt-token logprobs (echo): the first token has none."""
        x = torch.tensor([ids])
        logits = self.model(input_ids=x, use_cache=True).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        out: list[dict[str, Any]] = [{"token": self.tok.convert_ids_to_tokens(ids[0]), "logprob": None, "top": {}}]
        for pos in range(1, len(ids)):
            row = logp[pos - 1]
            out.append({"token": self.tok.convert_ids_to_tokens(ids[pos]), "logprob": float(row[ids[pos]]),
                        "top": _top(row, k, self.tok)})
        return out

    @torch.no_grad()
    def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        if any(r.on_token for r in reqs) and len(reqs) > 1:
            # transformers streams batch size 1 only: a streamed request runs on its own
            return [self.generate([r])[0] for r in reqs]
        if self.drafter is not None and len(reqs) == 1:
            return [self._generate_assisted(reqs[0])]
        return self._generate_batch(reqs)

    def _run(self, reqs: list[GenRequest], **extra):
        L = max(len(r.prompt_ids) for r in reqs)
        ids = torch.full((len(reqs), L), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(reqs), L), dtype=torch.long)
        for i, r in enumerate(reqs):  # left padding
            ids[i, L - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            mask[i, L - len(r.prompt_ids):] = 1
        sampler = SeededSampler(reqs, [r.bad_token_ids for r in reqs])
        if len(reqs) == 1 and reqs[0].on_token is not None:
            extra["streamer"] = _TokenStreamer(reqs[0].on_token)
        out = self.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max(r.max_tokens for r in reqs), do_sample=False,
            logits_processor=LogitsProcessorList([sampler]), eos_token_id=self.eos_id, pad_token_id=self.pad_id,
            output_logits=any(r.want_logprobs for r in reqs), return_dict_in_generate=True,
            temperature=None, top_p=None, top_k=None, **extra)
        return out, L

    def _generate_batch(self, reqs: list[GenRequest]) -> list[GenResult]:
        out, L = self._run(reqs)
        return [self._finish(r, out.sequences[i, L:].tolist(), out.logits, i) for i, r in enumerate(reqs)]

    def _generate_assisted(self, req: GenRequest) -> GenResult:
        before = self.forwards
        out, L = self._run([req], assistant_model=self.drafter)
        new = out.sequences[0, L:].tolist()
        verify = max(self.forwards - before, 1)
        res = self._finish(req, new, out.logits, 0)
        # tokens the target produced, EOS included (each verify step yields >= 1 token)
        n = len(new[: new.index(self.eos_id) + 1]) if self.eos_id in new else len([t for t in new if t != self.pad_id])
        self.spec_tokens += n
        self.spec_verify += verify
        res.meta_info.update(spec_verify_ct=verify, spec_accept_length=round(n / verify, 4))
        return res

    def avg_accept_length(self) -> float | None:
        return round(self.spec_tokens / self.spec_verify, 4) if self.spec_verify else None

    def _finish(self, r: GenRequest, new: list[int], logits, row: int) -> GenResult:
        finish = "length"
        if self.eos_id in new:
            new = new[: new.index(self.eos_id)]
            finish = "stop"
        new = [t for t in new if t != self.pad_id]
        if len(new) > r.max_tokens:  # batch ran to the longest request's limit
            new, finish = new[: r.max_tokens], "length"
        text = self.tok.decode(new, skip_special_tokens=False)
        for s in r.stop:
            j = text.find(s)
            if j >= 0:
                text, finish = text[:j], "stop"
                new = self.tok(text, add_special_tokens=False)["input_ids"]
        lps = None
        if r.want_logprobs and logits is not None:
            lps = []
            for step, t in enumerate(new[: len(logits)]):
                logp = torch.log_softmax(logits[step][row].float(), dim=-1)
                lps.append({"token": self.tok.convert_ids_to_tokens(t), "logprob": float(logp[t]),
                            "top": _top(logp, r.top_logprobs, self.tok)})
        return GenResult(token_ids=new, text=text, finish_reason=finish, logprobs=lps)
