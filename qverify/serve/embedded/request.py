"""What a generation request asks for and what it gets back (the server's and the engine's shared vocabulary)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class GenRequest:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    top_logprobs: int = 0
    want_logprobs: bool = False
    bad_token_ids: list[int] = field(default_factory=list)
    on_token: Callable[[list[int]], None] | None = None  # streaming: called with each step's new token ids
    prompt_logprobs: int | None = None  # echo: logprobs of the prompt tokens, with this many top alternatives
    ignore_eos: bool = False  # SGLang's sampling param: run to max_tokens


MAX_TOP_LOGPROBS = 20  # OpenAI's limit; each alternative costs a row per generated token


def check_request(req: GenRequest, vocab: int) -> None:
    """ValueError naming what is wrong with a request that must never reach the model: the server answers it
    400 at once, and the engine refuses it alone, so one bad request never fails or stalls a batch."""
    import math

    if not req.prompt_ids:
        raise ValueError("empty prompt")
    bad = [i for i in req.prompt_ids if not 0 <= i < vocab]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
    if not math.isfinite(req.temperature) or req.temperature < 0:
        raise ValueError(f"temperature must be a number >= 0 (got {req.temperature})")
    if not math.isfinite(req.top_p) or not 0 < req.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (got {req.top_p})")
    if req.seed is not None and not -(2**63) <= req.seed <= 2**63 - 1:  # SGLang's SamplingParams range (int64)
        raise ValueError(f"seed must be in [-2**63, 2**63 - 1] (got {req.seed})")
    if req.max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0 (got {req.max_tokens})")
    for name, k in (("top_logprobs", req.top_logprobs), ("logprobs", req.prompt_logprobs)):
        if k is not None and not 0 <= k <= MAX_TOP_LOGPROBS:
            raise ValueError(f"{name} must be between 0 and {MAX_TOP_LOGPROBS} (got {k})")
    if any(not 0 <= i < vocab for i in req.bad_token_ids):
        raise ValueError("a banned token id is outside the vocabulary")


@dataclass
class GenResult:
    token_ids: list[int]
    text: str
    finish_reason: str
    logprobs: list[dict[str, Any]] | None = None  # [{token, logprob, top: {tok: lp}}]
    meta_info: dict[str, Any] = field(default_factory=dict)
    prompt_logprobs: list[dict[str, Any]] | None = None
    # every token the engine generated, the EOS or stop-string tokens that ended it included: what SGLang and vLLM
    # report as usage.completion_tokens (token_ids is what the text decodes from, and can be empty)
    n_generated: int = 0


_ID_STRINGS: dict[int, tuple[Any, list]] = {}  # id(tokenizer) -> (tokenizer, its tokens by id)


def _token_strings(tok) -> list:
    """convert_ids_to_tokens for the whole vocabulary, once per tokenizer: echo logprobs name ~10 tokens per prompt
    position, and one call per id was most of an echo request's time."""
    hit = _ID_STRINGS.get(id(tok))
    if hit is None or hit[0] is not tok:
        hit = _ID_STRINGS[id(tok)] = (tok, list(tok.convert_ids_to_tokens(list(range(len(tok))))))
    return hit[1]


def lp_row(tok, out: list, t: int, lp: float | None, top: list[tuple[int, float]]) -> None:
    names = _token_strings(tok)

    def conv(i: int):
        return names[i] if 0 <= i < len(names) else tok.convert_ids_to_tokens(i)

    out.append({"token": conv(t), "logprob": lp, "top": {conv(i): v for i, v in top}})


def prompt_logprob_rows(tok, prompt_ids: tuple[int, ...], prompt_logp: torch.Tensor, k: int) -> list[dict[str, Any]]:
    """Echo logprob rows of a prompt: its first token has none, then each token's logprob and the top k."""
    rows: list[dict[str, Any]] = [{"token": tok.convert_ids_to_tokens(prompt_ids[0]), "logprob": None, "top": {}}]
    ids = torch.tensor(prompt_ids)
    chosen = prompt_logp[:-1].gather(1, ids[1:, None])[:, 0].tolist()
    top = prompt_logp[:-1].topk(k, -1) if k > 0 else None
    top_i, top_v = (top.indices.tolist(), top.values.tolist()) if top is not None else ([], [])
    for j, t in enumerate(prompt_ids[1:]):
        lp_row(tok, rows, t, chosen[j], list(zip(top_i[j], top_v[j])) if top is not None else [])
    return rows


def build_result(tok, r: GenRequest, tokens: list[int], finish: str | None, lps: list[dict[str, Any]],
                 prompt_rows: list[dict[str, Any]] | None, verify_ct: int) -> GenResult:
    """The response for a finished sequence: text cut at a stop string (re-tokenized, as before), logprobs,
    echo logprobs of the prompt (`prompt_rows`, from prompt_logprob_rows: built once per prompt and k, and shared,
    read-only, by the requests that echo it), and speculative stats (SGLang's meta_info names)."""
    eos = tok.eos_token_id
    new = [t for t in tokens if r.ignore_eos or t != eos]
    text, finish = tok.decode(new, skip_special_tokens=False), finish or "length"
    for x in r.stop:
        j = text.find(x)
        if j >= 0:
            text, finish = text[:j], "stop"
            new = tok(text, add_special_tokens=False)["input_ids"]
    meta: dict[str, Any] = {}
    if verify_ct:
        meta = {"spec_verify_ct": verify_ct, "spec_accept_length": round(len(tokens) / verify_ct, 4)}
    return GenResult(token_ids=new, text=text, finish_reason=finish,
                     logprobs=lps[: len(new)] if r.want_logprobs else None, meta_info=meta, prompt_logprobs=prompt_rows,
                     n_generated=len(tokens))
