"""Train qverify-tiny on CPU or GPU, resumable from its last checkpoint.

Budgets are in tokens (reproducible: the data stream is a function of the step);
wall time is recorded. Checkpoints every `ckpt_every_s` seconds to `<out>/work/`.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from qverify.reference.data import examples, induction_batch, pick_task

LOG = print


@dataclass
class TrainConfig:
    tokens: int = 20_000_000
    lr: float = 1e-3  # 3e-3 never formed an induction head (see data.py); 1e-3 did in ~1000 steps
    min_lr_frac: float = 0.05
    weight_decay: float = 0.01
    # Small batches: what copying needs is optimizer steps (the first run's 4096/64 gave ~3k steps in 12M tokens)
    batch_tokens: int = 2048
    max_batch: int = 32
    seed: int = 0
    ckpt_every_s: float = 120.0
    eval_every_tokens: int = 5_000_000
    eval_n: int = 30
    threads: int = 2
    stop_at: float = 0.0  # epoch seconds; past it, training stops early (a time budget), 0 = none
    curve: list = field(default_factory=list)


def encode(tok, prompt: str, answer: str, eos: str) -> tuple[list[int], int]:
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    a = tok(answer + eos, add_special_tokens=False)["input_ids"]
    return p + a, len(p)


def make_batch(tok, exs, eos: str, pad_id: int, device):
    seqs = [encode(tok, e.prompt, e.answer, eos) for e in exs]
    L = max(len(s) for s, _ in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    ans = torch.zeros((len(seqs), L), dtype=torch.bool)
    valid = torch.zeros((len(seqs), L), dtype=torch.bool)
    for i, (s, p) in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        valid[i, : len(s)] = True
        ans[i, p: len(s)] = True
    return ids.to(device), valid.to(device), ans.to(device)


def loss_fn(model, ids, valid, ans):
    logits = model(input_ids=ids, attention_mask=valid.long()).logits[:, :-1].float()
    tgt = ids[:, 1:]
    ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1), reduction="none").view_as(tgt)
    v, a = valid[:, 1:].float(), ans[:, 1:].float()
    return (ce * v).sum() / v.sum() + (ce * a).sum() / a.sum().clamp(min=1)


def lr_at(cfg: TrainConfig, seen: int) -> float:
    p = min(seen / cfg.tokens, 1.0)
    warm = min(1.0, seen / 200_000)
    return cfg.lr * warm * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))


def train(model, tok, cfg: TrainConfig, work: Path, evaluate=None, task_fn=pick_task, example_fn=examples,
          tag: str = "target") -> dict:
    """Train `model` in place; resume from `work/<tag>.pt` when present. Returns the final state summary."""
    torch.manual_seed(cfg.seed)
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    ckpt = work / f"{tag}.pt"
    state = _resume(ckpt, model, opt, device, tag) or {"step": 0, "seen": 0, "wall": 0.0, "curve": [],
                                                       "next_eval": cfg.eval_every_tokens}
    t_last_ckpt = t0 = time.time()
    wall0 = state["wall"]
    model.train()
    while state["seen"] < cfg.tokens:
        if cfg.stop_at and time.time() > cfg.stop_at:
            LOG(f"[{tag}] time budget reached at {state['seen'] / 1e6:.2f}M of {cfg.tokens / 1e6:.2f}M tokens", flush=True)
            state["stopped_early"] = True
            break
        task, (ids, valid, ans) = _next_batch(tok, cfg, tag, state, task_fn, example_fn, device)
        for g in opt.param_groups:
            g["lr"] = lr_at(cfg, state["seen"])
        loss = loss_fn(model, ids, valid, ans)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        state["step"] += 1
        state["seen"] += int(valid.sum())
        state["wall"] = wall0 + time.time() - t0
        if state["step"] % 50 == 0:
            LOG(f"[{tag}] step {state['step']} {state['seen'] / 1e6:.2f}M tok {state['wall'] / 60:.1f} min "
                f"loss {loss.item():.3f} task {task} lr {lr_at(cfg, state['seen']):.2e} "
                f"{state['seen'] / max(state['wall'], 1e-9):.0f} tok/s", flush=True)
        if evaluate and state["seen"] >= state["next_eval"] and state["seen"] < cfg.tokens:
            model.eval()
            scores = evaluate(model, cfg.eval_n)
            model.train()
            state["curve"].append({"tokens": state["seen"], "minutes": round(state["wall"] / 60, 1), **scores})
            LOG(f"[{tag}] eval {json.dumps(state['curve'][-1])}", flush=True)
            state["next_eval"] += cfg.eval_every_tokens
        if time.time() - t_last_ckpt > cfg.ckpt_every_s:
            _save(ckpt, model, opt, state)
            t_last_ckpt = time.time()
    _save(ckpt, model, opt, state)
    model.eval()
    return state


def _resume(ckpt: Path, model, opt, device, tag: str) -> dict | None:
    """Load model and optimizer from `ckpt` when it exists; returns its training state (None: start afresh)."""
    if not ckpt.exists():
        return None
    blob = torch.load(ckpt, map_location=device, weights_only=False)
    model.load_state_dict(blob["model"])
    opt.load_state_dict(blob["opt"])
    state = blob["state"]
    LOG(f"[{tag}] resumed at step {state['step']}, {state['seen'] / 1e6:.2f}M tokens, {state['wall'] / 60:.1f} min")
    return state


def _next_batch(tok, cfg: TrainConfig, tag: str, state: dict, task_fn, example_fn, device) -> tuple[str, tuple]:
    """(task, (ids, valid, answer mask)) of this step: drawn from the step number, so a resumed run draws the same."""
    rng = random.Random(f"{cfg.seed}:{tag}:{state['step']}")
    task, length = task_fn(rng, state["seen"] / cfg.tokens)
    est = {"copy": 40, "induction": 64, "coding": 110, "toolcall": 150}.get(task, length + 20)
    bsz = max(1, min(cfg.max_batch, cfg.batch_tokens // est))
    seed = state["step"] * 7919 + cfg.seed
    if task == "induction":
        # ids above the special tokens; random ids, not text, so there is nothing to guess but a copy
        sep = tok.convert_tokens_to_ids("<|im_middle|>")
        return task, tuple(t.to(device) for t in induction_batch(bsz, seed, len(tok.all_special_ids) + 1, len(tok), sep))
    count = lambda s: len(tok(s, add_special_tokens=False)["input_ids"])
    return task, make_batch(tok, example_fn(task, bsz, seed, count, length), tok.eos_token, tok.pad_token_id, device)


def _save(path: Path, model, opt, state) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": state}, tmp)
    tmp.replace(path)  # atomic: a kill mid-save leaves the previous checkpoint intact


def config_dict(cfg: TrainConfig) -> dict:
    d = asdict(cfg)
    d.pop("curve", None)
    return d
