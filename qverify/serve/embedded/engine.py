"""The embedded server's generation engine: continuous batching over an MLA latent cache, on CPU.

Why not transformers' own continuous batching: `generate_batch`'s paged cache fails on MLA (it assumes K and V
share a head dim; re-checked with transformers 5.17) and would cache expanded K/V, not production's latent; and
`generate`'s DynamicCache pushes the whole cached latent through kv_b_proj every step (field notes).

What this engine does (SGLang's design, at CPU scale):
- continuous batching: requests join after a prefill and leave as soon as they finish, at every step;
- prefix sharing: a prompt is prefilled once for every request carrying it (an item's replicates), and decode
  attention reads its rows once for all of them (mla.py); with an FP8 cache, generation requests read it as
  SGLang's radix hits do, the prefix back from the FP8 pool (prefix_reads.py), once for all of them;
- a vectorized, batch-invariant seeded sampler (sampler.py);
- speculative decoding across the batch: the drafter (standalone_draft.py, eagle3_draft.py) proposes `spec_tokens`
  tokens for every running sequence, the target verifies them all in one forward; a position's token is accepted
  when the target, sampling with that position's seeded noise, picks it, so outputs are the same as without one.
"""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from collections.abc import Callable

import torch

from qverify.serve.embedded.admission import take_waiting
from qverify.serve.embedded.eagle3_draft import Eagle3Drafter, is_eagle3_head
from qverify.serve.embedded.prefix_reads import CHUNKED_PREFILL_SIZE, take_hits
from qverify.serve.embedded.request import (
    GenRequest,
    GenResult,
    build_result,
    check_request,
    lp_row,
    prompt_logprob_rows,
)
from qverify.serve.embedded.runner import ModelRunner, PromptKV
from qverify.serve.embedded.sampler import logprob_rows, sample
from qverify.serve.embedded.sequence import Aborted, Prompt, Seq, sampling_params
from qverify.serve.embedded.standalone_draft import propose_standalone

__all__ = ["Engine", "GenRequest", "GenResult"]

# finished prompts kept for reuse (replicates that arrive after their siblings finished). 64: a choice, not tuned
# or measured; the runner sends an item's replicates adjacent (qverify.evals.runner), so a late replicate usually
# finds its prompt among the last few dozen finished.
KEEP_PROMPTS = 64


class Engine:
    def __init__(self, model, tokenizer, drafter=None, max_batch: int = 256, spec_tokens: int = 4,
                 fp8_kv: bool = False, scale_mode: str = "production", sglang_scales: dict[int, float] | None = None,
                 prefill_tokens: int = 4096, attention_backend: str = "trtllm_mla",
                 chunked_prefill_size: int | None = CHUNKED_PREFILL_SIZE):
        self.tok = tokenizer
        self.model, self.drafter = model, drafter
        # attention_backend: whose FP8-KV numerics to emulate (kv_fp8.py; the serving profile's, default trtllm_mla)
        self.runner = ModelRunner(model, max_batch, fp8_kv, scale_mode, sglang_scales, attention_backend=attention_backend)
        self.eagle = Eagle3Drafter(drafter) if is_eagle3_head(drafter) else None
        self.draft = (ModelRunner(drafter, max_batch, fp8_kv, scale_mode, attention_backend=attention_backend)
                      if drafter is not None and self.eagle is None else None)
        self.runner.capture = self.eagle.capture if self.eagle is not None else []
        # SGLang reads a cached prefix (a repeated prompt, a long prompt's earlier chunks) back from its FP8 pool
        # (prefix_reads.py); a bf16 pool gives back the rows it was given, so only an FP8 cache changes anything
        self.backend, self.reads_fp8_prefix = attention_backend, self.runner.fp8_kv and scale_mode == "production"
        self.runner.chunk = chunked_prefill_size if self.reads_fp8_prefix else None
        # SGLang's --speculative-algorithm name for what drafts here, or None
        self.speculative = "EAGLE3" if self.eagle is not None else ("STANDALONE" if self.draft is not None else None)
        self.max_batch, self.spec_tokens, self.prefill_tokens = max_batch, spec_tokens, prefill_tokens
        self.eos_id = tokenizer.eos_token_id
        self.vocab = model.config.vocab_size
        self.n_embeddings = model.get_input_embeddings().num_embeddings  # the ids a prompt may hold
        self.waiting: deque[Seq] = deque()
        self._admitting: list[Seq] = []  # taken from `waiting`, not yet running: fail_all must answer them too
        self.running: list[Seq] = []
        self.prompts: OrderedDict[tuple[int, ...], Prompt] = OrderedDict()
        self._serial = 0
        self._groups_cache: dict[bool, tuple[int, list]] = {}
        self._sampling_cache: tuple[int, tuple] | None = None
        self._running_version = 0  # bumped whenever `running` changes (membership or order)
        self.stats = {"requests": 0, "batches": 0, "steps": 0, "prefill_tokens": 0, "shared_prefills": 0,
                      "max_running": 0, "spec_tokens": 0, "spec_verify": 0, "aborted": 0, "prefix_hits": 0}

    @property
    def max_context(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))

    def avg_accept_length(self) -> float | None:
        v = self.stats["spec_verify"]
        return round(self.stats["spec_tokens"] / v, 4) if v else None

    def add(self, req: GenRequest, done: Callable[[GenResult | None, BaseException | None], None]) -> None:
        check_request(req, min(self.vocab, self.n_embeddings))  # ValueError: this request alone is refused
        seed = req.seed if req.seed is not None else random.getrandbits(32)
        self.waiting.append(Seq(req, done, seed))
        self.stats["requests"] += 1

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        """Run requests to completion on this thread (tests, benchmarks); the server uses worker.py."""
        out: list[GenResult | None] = [None] * len(reqs)
        for i, r in enumerate(reqs):
            self.add(r, lambda res, exc, i=i: out.__setitem__(i, res if exc is None else exc))
        while self.has_work():
            self.step()
        for o in out:
            if isinstance(o, BaseException):
                raise o
        return out  # type: ignore[return-value]

    def step(self) -> None:
        """Admit what fits (prefill), then one decode (or speculative) step for every running sequence."""
        self._admit()
        if self.running:
            self.stats["steps"] += 1
            self.stats["max_running"] = max(self.stats["max_running"], len(self.running))
            self._spec_step() if self.speculative else self._decode_step()
            self._retire()

    def abort(self, req: GenRequest) -> bool:
        """Drop `req`'s sequence (its client went away), between two steps: its slot and prompt are freed at once
        and its request is answered with Aborted. False when the engine no longer holds it."""
        for s in self.waiting:
            if s.req is req:
                self.waiting.remove(s)
                self.stats["aborted"] += 1
                s.done(None, Aborted("the client disconnected"))
                return True
        for s in self.running:
            if s.req is req and s.finish is None:
                s.fail(Aborted("the client disconnected"))
                self.stats["aborted"] += 1
                self._retire()
                return True
        return False

    def fail_all(self, exc: BaseException) -> None:
        """For a failure no single sequence can be blamed for (the batched forward itself)."""
        # every sequence the engine holds is answered, those caught mid-admission too (they were in neither list)
        for s in [*self._admitting, *self.running, *self.waiting]:
            s.done(None, exc)
        self._admitting = []
        self.running.clear()  # (no version bump: nothing decodes before an admission bumps it)
        self.waiting.clear()
        self.prompts.clear()

    # ---- admission: prefill new prompts once, share them ----
    def _admit(self) -> None:
        fresh, admitted = take_waiting(self)
        if not admitted:
            return
        self._admitting = admitted
        admitted = self._admitting = take_hits(self, self._prefill_fresh(fresh, admitted))
        self.stats["batches"] += 1
        self._start(admitted)
        self._admitting = []
        self._evict()

    def _prefill_fresh(self, fresh: dict[tuple[int, ...], Prompt], admitted: list[Seq]) -> list[Seq]:
        """Prefill the new prompts and cache them; answers the sequences whose prompt failed, returns the rest."""
        if fresh:
            failed = self._prefill_each_alone_on_error(
                list(fresh.values()), {tuple(s.req.prompt_ids) for s in admitted if s.req.prompt_logprobs is not None})
            for s in admitted:
                if s.prompt.ids in failed:
                    s.done(None, failed[s.prompt.ids])
            admitted = self._admitting = [s for s in admitted if s.prompt.ids not in failed]
            for k in failed:
                del fresh[k]
        for p in fresh.values():
            self.prompts[p.ids] = p
        for s in admitted:
            self.prompts.move_to_end(s.prompt.ids)
        return admitted

    def _start(self, admitted: list[Seq]) -> None:
        """Answer the echo-only sequences; sample the others' first token and start them decoding."""
        starting = [s for s in admitted if s.req.max_tokens > 0]
        for s in admitted:
            if s.req.max_tokens <= 0:
                s.finish = "length"
                self._done(s)
        if not starting:
            return
        logits = torch.stack([s.prompt.last_logits for s in starting])
        toks = self._sample(starting, logits, torch.zeros(len(starting), dtype=torch.long))
        for b, (s, t) in enumerate(zip(starting, toks.tolist())):
            s.draft_pending = [t]
            if self.eagle is not None:
                s.eagle = self.eagle.start(s.prompt.eagle, t)
            self._emit(s, [t], logits, b)
            if s.finish is None:
                self.running.append(s)
                self._running_version += 1
            else:
                self._done(s)
        if self.running:  # the longest any running sequence can grow: the runners' buffers grow there once
            most = min(max(s.req.max_tokens for s in self.running), self.max_context) + self.spec_tokens + 1
            for r in (self.runner, self.draft):
                if r is not None:
                    r.reserve(most)

    def _prefill_each_alone_on_error(self, prompts: list[Prompt], echo: set[tuple[int, ...]]) -> dict[tuple, Exception]:
        """Prefill together; if that fails, each prompt alone, so only the prompts that fail by themselves fail
        (their sequences are answered with the error, the others go on). Returns {prompt ids: error}."""
        try:
            self._prefill(prompts, echo)
            return {}
        except Exception as e:  # noqa: BLE001 - isolated below, then reported to the failing prompt's requests only
            if len(prompts) == 1:
                return {prompts[0].ids: e}
        failed: dict[tuple, Exception] = {}
        for p in prompts:
            try:
                self._prefill([p], echo)
            except Exception as e:  # noqa: BLE001 - this prompt's own failure
                failed[p.ids] = e
        return failed

    def _prefill(self, prompts: list[Prompt], echo: set[tuple[int, ...]]) -> None:
        rows, start, spans = [], 0, []
        for p in prompts:
            n = len(p.ids)
            spans.append((start, n, p.ids in echo))
            rows.extend(range(start, start + n) if p.ids in echo else [start + n - 1])
            start += n
        self.stats["prefill_tokens"] += start
        kvs, logits = self.runner.prefill([list(p.ids) for p in prompts], torch.tensor(rows))
        at = 0
        for p, kv, (_, n, all_rows) in zip(prompts, kvs, spans):
            p.kv = kv
            k = n if all_rows else 1
            p.last_logits = logits[at + k - 1]
            if all_rows:
                p.logp = torch.log_softmax(logits[at: at + k], -1)
            at += k
        if self.eagle is not None:
            for p, (start, n, _) in zip(prompts, spans):
                p.eagle = self.eagle.prompt_rows(p.ids, self.runner.aux[start: start + n])
        if self.draft is not None:
            dkvs, _ = self.draft.prefill([list(p.ids) for p in prompts], torch.tensor([], dtype=torch.long))
            for p, kv in zip(prompts, dkvs):
                p.draft_kv = kv

    def _evict(self) -> None:
        idle = [k for k, p in self.prompts.items() if p.users == 0]
        for k in idle[: max(0, len(idle) - KEEP_PROMPTS)]:
            del self.prompts[k]

    # ---- decoding ----
    def _groups(self, draft: bool) -> list[tuple[PromptKV, torch.Tensor]]:
        """Running sequences by prompt; the same list until `running` changes (the runner keeps its read plan)."""
        key = self._running_version
        if self._groups_cache.get(draft, (None,))[0] != key:
            by: dict[int, tuple[PromptKV, list[int]]] = {}
            for i, s in enumerate(self.running):
                by.setdefault(s.prompt.serial, (s.prompt.draft_kv if draft else s.prompt.kv, []))[1].append(i)
            self._groups_cache[draft] = (key, [(by[k][0], torch.tensor(by[k][1])) for k in sorted(by)])
        return self._groups_cache[draft][1]

    def _decode_step(self) -> None:
        run = self.running
        ids = torch.tensor([[s.last] for s in run])
        gl = torch.tensor([s.gen_len for s in run])
        pos = torch.tensor([[len(s.prompt.ids) + s.gen_len] for s in run])
        logits = self.runner.decode(ids, pos, gl, self._groups(False))[:, 0]
        toks = self._sample(run, logits, torch.tensor([len(s.tokens) for s in run]), cache=True)
        for b, (s, t) in enumerate(zip(run, toks.tolist())):
            s.gen_len += 1
            self._emit(s, [t], logits, b)

    def _spec_step(self) -> None:
        run, k = self.running, self.spec_tokens
        drafts = (propose_standalone(run, self.draft, self._groups(True), k) if self.eagle is None
                  else self.eagle.propose([s.eagle for s in run], k))  # [B, k]
        ids = torch.cat([torch.tensor([[s.last] for s in run]), drafts], 1)
        gl = torch.tensor([s.gen_len for s in run])
        pos = torch.tensor([len(s.prompt.ids) + s.gen_len for s in run])[:, None] + torch.arange(k + 1)[None]
        logits = self.runner.decode(ids, pos, gl, self._groups(False))  # [B, k + 1, V]
        aux = self.runner.aux  # EAGLE3: the target's states at the k + 1 positions [B, k + 1, aux width]
        B = len(run)
        steps = torch.tensor([len(s.tokens) for s in run])[:, None] + torch.arange(k + 1)[None]
        seqs = [s for s in run for _ in range(k + 1)]
        target = self._sample(seqs, logits.reshape(B * (k + 1), -1), steps.reshape(-1)).view(B, k + 1)
        match = (drafts == target[:, :k]).long().cumprod(1).sum(1).tolist()
        for b, s in enumerate(run):
            a = match[b]
            s.verify_ct += 1
            self.stats["spec_verify"] += 1
            emitted = target[b, : a + 1].tolist()
            self.stats["spec_tokens"] += len(emitted)
            s.gen_len += 1 + a
            if self.eagle is not None:
                self.eagle.accepted(s.eagle, emitted, aux[b])
            else:
                s.draft_len += min(a, k - 1) - (k - 1)  # propose_standalone counted all k - 1 draft rows as valid
                s.draft_pending = ([int(drafts[b, k - 1])] if a == k else []) + [emitted[-1]]
            self._emit(s, emitted, logits[b])

    def _sample(self, seqs: list[Seq], logits: torch.Tensor, steps: torch.Tensor, cache: bool = False) -> torch.Tensor:
        """`cache`: seqs is `running`; its per-row parameters are reused until `running` changes."""
        if cache and self._sampling_cache is not None and self._sampling_cache[0] == self._running_version:
            params = self._sampling_cache[1]
        else:
            params = sampling_params(seqs, logits.shape[-1])
            if cache:
                self._sampling_cache = (self._running_version, params)
        temperature, top_p, seeds, banned = params
        return sample(logits, temperature, top_p, seeds, steps, banned)

    def _emit(self, s: Seq, toks: list[int], logits: torch.Tensor, at: int = 0) -> None:
        """Append tokens (stopping at EOS, max_tokens or a stop string); stream them; record logprobs.
        Token j's logits are row `at + j` of `logits` (sliced only when logprobs are asked for). What raises here
        is this sequence's own (its stop strings, its logprobs, its stream callback): it fails alone."""
        if s.error is not None:
            return
        try:
            self._emit_tokens(s, toks, logits, at)
        except Exception as e:  # noqa: BLE001 - reported to this sequence's request; the batch goes on
            s.fail(e)

    def _emit_tokens(self, s: Seq, toks: list[int], logits: torch.Tensor, at: int) -> None:
        r, new = s.req, []
        for j, t in enumerate(toks):
            s.tokens.append(t)
            if t == self.eos_id and not r.ignore_eos:
                s.finish = "stop"
                break
            new.append(t)
            if r.want_logprobs:
                lp, top = logprob_rows(logits[at + j: at + j + 1], torch.tensor([t]), r.top_logprobs)
                lp_row(self.tok, s.lps, t, lp[0], top[0])
            if len(s.tokens) >= r.max_tokens:
                s.finish = "length"
                break
            if r.stop and any(x in self._text(s) for x in r.stop):
                s.finish = "stop"
                break
        if new and r.on_token is not None:
            r.on_token(new)

    def _text(self, s: Seq) -> str:
        toks = s.tokens[:-1] if s.tokens and s.tokens[-1] == self.eos_id and not s.req.ignore_eos else s.tokens
        return self.tok.decode(toks, skip_special_tokens=False)

    def _retire(self) -> None:
        for i in range(len(self.running) - 1, -1, -1):
            s = self.running[i]
            if s.finish is None:
                continue
            last = len(self.running) - 1
            if i != last:  # keep slots 0..B-1 dense: the last sequence moves into the freed slot
                moved = self.running[last]
                self.runner.move_slot(last, i, moved.gen_len)
                if self.draft is not None:
                    self.draft.move_slot(last, i, moved.draft_len)
                self.running[i] = moved
            self.running.pop()
            self._running_version += 1
            self._done(s)

    def _done(self, s: Seq) -> None:
        (s.prompt.base or s.prompt).users -= 1
        if s.error is not None:
            s.done(None, s.error)
            return
        try:
            k, p = s.req.prompt_logprobs, s.prompt
            echo = None
            if k is not None and p.logp is not None:
                echo = p.echo_rows.get(k)
                if echo is None:  # replicates echo the same prompt: its rows are built once and shared
                    echo = p.echo_rows[k] = prompt_logprob_rows(self.tok, p.ids, p.logp, k)
            res = build_result(self.tok, s.req, s.tokens, s.finish, s.lps, echo,
                               s.verify_ct if self.speculative else 0)
        except Exception as e:  # noqa: BLE001 - reported to that request, the engine lives on
            s.done(None, e)
            return
        s.done(res, None)
