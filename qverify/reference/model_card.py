"""Write the trained target + drafter and the model card (README.md) under qverify/assets/.

The card is rendered from two measured files in the asset folder, so it can always be
regenerated: training.json (training, learning curve, greedy test scores, acceptance per
suite; written by scripts/train_reference_model.py) and quant_sensitivity.json (scores at
the gating sampling and every built-in recipe's; written by scripts/quant_sensitivity.py).
"""

from __future__ import annotations

import json
import platform
import shutil
from pathlib import Path

import torch

from qverify.reference.arch import param_counts
from qverify.reference.train import config_dict


def _save(model, tok, path: Path) -> None:
    model = model.to("cpu").to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    model.to(torch.float32)


def write(out: Path, target, draft, tok, state, dstate, final, accept, cfg, dcfg, device, wall_s, threads,
          warm_start: dict | None = None, test_n: int = 60) -> None:
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    _save(target, tok, tmp)
    _save(draft, tok, tmp / "drafter")
    training = {"target": {"config": config_dict(cfg), "tokens": state["seen"], "minutes": round(state["wall"] / 60, 1),
                           "curve": state["curve"], "stopped_early": state.get("stopped_early", False)},
                "drafter": {"config": config_dict(dcfg), "tokens": dstate["seen"], "minutes": round(dstate["wall"] / 60, 1)},
                "device": device, "threads": threads, "machine": platform.processor() or platform.machine(),
                "test": final, "acceptance": accept, "params": param_counts(target), "drafter_params": param_counts(draft),
                "total_wall_minutes": round(wall_s / 60, 1), "warm_start": warm_start, "test_n": test_n,
                "data": data_stats()}
    (tmp / "training.json").write_text(json.dumps(training, indent=2))
    if (out / "quant_sensitivity.json").exists():  # the previous model's: rendered as stale until remeasured
        shutil.copy(out / "quant_sensitivity.json", tmp / "quant_sensitivity.json")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    render_card(out)


def data_stats(n: int = 60) -> dict:
    """How the coding splits were made: candidates drawn, dropped as another split's or as a
    behaviour already in the split, and the leak check of validation/test against train."""
    from qverify.suites import coding_check
    from qverify.suites.coding import CodingSuite

    suite = CodingSuite()
    stats = {s: suite.generate(s, n, 0)[1] for s in ("validation", "test")}
    train = suite.items("train", 300, 0)
    stats["leaks_vs_train_300"] = {s: len(coding_check.leaks(train, suite.items(s, n, 0))) for s in ("validation", "test")}
    return stats


def render_card(asset: Path) -> None:
    t = json.loads((asset / "training.json").read_text())
    qs_path = asset / "quant_sensitivity.json"
    qs = json.loads(qs_path.read_text()) if qs_path.exists() else None
    (asset / "README.md").write_text(card(t, qs))


def _curve(t: dict) -> str:
    rows = [f"| {c['tokens'] / 1e6:.2f}M | {c['minutes']} | {c.get('coding/pass@1', '–')} | {c.get('toolcall/exact_call', '–')} "
            f"| {c.get('longctx/accuracy', '–')} |" for c in t["target"]["curve"]]
    end = t["test"]
    rows.append(f"| {t['target']['tokens'] / 1e6:.2f}M (end; **test** split, {t.get('test_n', 60)} items) | {t['target']['minutes']} "
                f"| {end.get('coding/pass@1')} | {end.get('toolcall/exact_call')} | {end.get('longctx/accuracy')} |")
    return "\n".join(rows)


def _sampled_scores(qs: dict | None) -> str:
    if not qs:
        return "Not measured yet: run `scripts/quant_sensitivity.py --run --write-card`."
    base = next((r for r in qs["rows"] if r["recipe"] == "bf16"), None)
    if base is None:
        return "No bf16 run in the last `scripts/quant_sensitivity.py` measurement."
    lines = ["| metric | mean over replicates | replicate range | replicates × items |", "|---|---|---|---|"]
    for k, c in base["cells"].items():
        if c:
            lines.append(f"| {k} | {c['mean']:.3f} | {c['min']:.2f}–{c['max']:.2f} | {c['replicates']} × {c['items']} |")
    return "\n".join(lines)


def _fmt(c: dict | None) -> str:
    if c is None:
        return "–"
    if c["replicates"] == 1:
        return f"{c['mean']:.3f} [1×{c['items']}]"
    return f"{c['mean']:.3f} ({c['min']:.2f}–{c['max']:.2f}) [{c['replicates']}×{c['items']}]"


def sensitivity_table(qs: dict | None) -> str:
    """Every measured recipe: mean (replicate range) [replicates × items] per metric, KL, gate verdict."""
    if not qs or not qs.get("rows"):
        return "Not measured yet: run `scripts/quant_sensitivity.py --run --write-card`."
    head = ["recipe", *qs["rows"][0]["cells"], "KL vs bf16 (nats)", "gate vs bf16"]
    lines = [qs.get("note", ""), "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in qs["rows"]:
        failed = row["failed"]
        verdict = row["verdict"] + (f" ({', '.join(failed[:3])}{', …' if len(failed) > 3 else ''})" if failed else "")
        kl = "–" if row["kl"] is None else f"{row['kl']:.4f}"
        name = row["recipe"] + (" (control)" if row["control"] else "")
        lines.append("| " + " | ".join([name, *(_fmt(c) for c in row["cells"].values()), kl, verdict]) + " |")
    if qs.get("not_measured"):
        lines += ["", "Built but not measured: " + ", ".join(qs["not_measured"]) + "."]
    return "\n".join(lines).lstrip("\n")


def _drafter_line(d: dict) -> str:
    ws = d.get("warm_start")
    if not ws:
        return (f"warm-started likewise and distilled on the target's own greedy outputs for train prompts, "
                f"{d['tokens'] / 1e6:.2f}M tokens in {d['minutes']} min.")
    pool = ", ".join(f"{k} {v}" for k, v in d["pool"].items())
    mix = " / ".join(f"{k} {v:.0%}" for k, v in d["mix"].items())
    return (f"the previous drafter ({ws['tokens'] / 1e6:.2f}M tokens, {ws['minutes']} min, distilled on the target's "
            f"greedy outputs only) re-distilled against the unchanged target for {d['tokens'] / 1e6:.2f}M tokens in "
            f"{d['minutes']} min ({d['config']['threads']} thread): the first {d['induction_first']:.0%} of tokens "
            f"random-token induction (copying), then {mix}; the pool is the target's greedy answers to "
            f"train prompts ({pool}; long context at every length 128–1024). Why: the previous drafter copied nothing "
            f"from the prompt (see Speculative decoding).")


def _acceptance(t: dict) -> str:
    """Accept length per suite, as the engine serves it; the previous drafter's alongside when it was re-distilled."""
    acc, before = t["acceptance"], (t.get("drafter") or {}).get("acceptance_before")
    if "drafter_top1" not in next(iter(acc.values())):  # the first card's measure (transformers assisted decoding)
        return ("Transformers assisted greedy decoding with the drafter, on test items of each suite: target tokens "
                "per target forward pass, and the share of items whose assisted output is identical to plain greedy:\n\n"
                "| suite | accept length | greedy-identical | items |\n|---|---|---|---|\n"
                + "\n".join(f"| {s} | {a['accept_length']} | {a['greedy_identical'] * 100:.0f}% | {a['items']} |"
                            for s, a in acc.items()))
    t06 = next(k for k in next(iter(acc.values())) if k.startswith("accept_length_t"))
    head = ("As the embedded server reports it (`spec_accept_length`, SGLang's measure; `qverify.reference.spec_accept`): "
            "tokens generated, the EOS included, per target verify step of 4 drafted tokens, on test items of each "
            "suite, greedy and at T " + t06.removeprefix("accept_length_t") + " (seeded); *max* is what a drafter "
            "that is always right would reach on these answers (short answers cap it); *drafter top-1*: how often the "
            "drafter's greedy token is the target's, on the target's greedy output; *greedy-identical*: assisted "
            "greedy output equal to plain greedy (the engine accepts only the target's own tokens).\n\n"
            "| suite | accept length (greedy) | at T " + t06.removeprefix("accept_length_t") + " | max | drafter top-1 "
            "| answer tokens | greedy-identical | items |" + (" previous drafter (greedy / top-1) |" if before else "")
            + "\n|---|---|---|---|---|---|---|---|" + ("---|" if before else ""))
    rows = [f"| {s} | {a['accept_length']} | {a[t06]} | {a['max_attainable']} | {a['drafter_top1']} | "
            f"{a['answer_tokens_mean']} | {a['greedy_identical'] * 100:.0f}% | {a['items']} |"
            + (f" {before[s]['accept_length']} / {before[s]['drafter_top1']} |" if before else "") for s, a in acc.items()]
    return "\n".join([head, *rows])


def card(t: dict, qs: dict | None = None) -> str:
    """The model card (the asset's README.md), section by section."""
    return _intro(t) + _splits(t) + _training(t) + _results(t, qs) + REPRODUCING


def _intro(t: dict) -> str:
    return f"""# qverify-tiny

The embedded reference model of qverify: a transformers `DeepseekV3ForCausalLM` (the DeepSeek-V3 /
Kimi K2 architecture) trained on CPU by `scripts/train_reference_model.py` on the suites' **train**
split. It exists so that `qverify build` + `qverify gate` give real scores that quantization can
move, with no model hub. Every table below is measured; `training.json` and `quant_sensitivity.json`
hold the numbers, and `qverify.reference.model_card.render_card` renders this file from them.

## Architecture
- MLA attention with kv_lora_rank 512 and qk_rope_head_dim 64: 576 KV values per token per layer, as in DeepSeek-V3.
- hidden 128, 3 layers (`first_k_dense_replace=1`), 8 routed experts top-2 + 1 shared expert per MoE layer.
- vocab 768 (byte-level BPE; words, whitespace runs, single digits and punctuation pre-split), Kimi-K2 chat and tool-call format.
- Parameters: {t['params']['total']:,} total, {t['params']['active']:,} active per token.
- Drafter (`drafter/`): 2 dense layers, hidden 96, {t['drafter_params']['total']:,} parameters, same tokenizer.

"""


def _splits(t: dict) -> str:
    d = t.get("data") or {}
    dedupe = "\n".join(
        f"| {s} | {st['drawn']} | {st['other_split']} | {st['duplicate_behaviour']} | {d.get('leaks_vs_train_300', {}).get(s, '–')} |"
        for s, st in d.items() if s in ("validation", "test"))
    return f"""## Splits: train, validation, test
Every synthetic suite hashes an item's identity key into **test** (10% of the key space), **validation**
(10%) or **train** (80%, the same train share as the first model's). Training reads train only; the
learning curve and any tuning of the recipe read validation; the scores below and `qverify eval`'s
default are test, which nothing in training looked at. Coding's key is the program's **behaviour**
(outputs on fixed probe inputs), so an item that behaves like a training item cannot be in test,
whatever its names or wording; within a split, a candidate that behaves like an earlier one is dropped
as a near-duplicate. `coding_check.leaks` re-checks both the normalized program (AST, names
canonicalised) and the signature:

| split (60 items, seed 0) | candidates drawn | in another split | near-duplicates dropped | leaks vs 300 train items |
|---|---|---|---|---|
{dedupe}

Coding items (`qverify/suites/coding_gen.py`) are specs in words that must be composed: "the sum of the
squares of the elements of xs that are odd", "the length of the longest run of equal adjacent characters in
s", "the index of the first element of xs greater than the mean of the elements before it"; four levels
(one step; reducer + map + filter; the same over even/odd positions, running values and adjacent
comparisons; stateful scans), and hidden tests that include, for every program one choice away, an input
on which it differs.

"""


def _training(t: dict) -> str:
    ws = t.get("warm_start")
    init = (f"warm-started from the previous qverify-tiny ({ws['tokens'] / 1e6:.1f}M tokens, {ws['minutes']} min, "
            "trained on the first coding generator), then " if ws else "trained from scratch, then ")
    c = t["target"]["config"]
    notes = "".join(f"\n- {n}" for n in t.get("notes", []))
    return f"""## Training
- Target: {init}{t['target']['tokens'] / 1e6:.2f}M tokens in {t['target']['minutes']} min on {t['device']} ({t['threads']} thread(s)),
  AdamW fp32, LR {c['lr']:g} cosine to {c['min_lr_frac']:g}×, batches of ≤ {c['batch_tokens']} tokens, loss = mean over all
  tokens + mean over answer tokens. Mix after the warm start (`data.WARM_START_MIX`): coding 50% / toolcall 20% /
  longctx 22% (128–1024 tokens) / copy 4% / induction 4%.
- The first model's curriculum (from scratch): an induction warm-up on random token ids repeated once, then
  chat-wrapped copy, then the task mix with long context ramped 128 → 1024. Why: every suite needs copying
  from the prompt, and a first run without it never learned to copy (coding 0%, toolcall 1.7%, longctx 0%).
- Drafter: {_drafter_line(t['drafter'])}
- Whole script: {t['total_wall_minutes']} min wall on a shared machine. Config and curve: `training.json`.{notes}

### Learning curve (greedy; validation, {c['eval_n']} items per suite, unless marked)
| tokens | minutes | coding pass@1 | toolcall exact | longctx acc |
|---|---|---|---|---|
{_curve(t)}

"""


def _results(t: dict, qs: dict | None) -> str:
    held = "\n".join(f"| {k} | {v} |" for k, v in sorted(t["test"].items()))
    return f"""## Scores on the test split
At each suite's gating sampling (T 0.6, top-p 0.95), served by the embedded server with `qverify eval`
on the bf16 build (from `scripts/quant_sensitivity.py`):

{_sampled_scores(qs)}

Greedy, bf16 weights, straight on the model (`qverify.reference.evaluate`, {t.get('test_n', 60)} test items per suite):

| metric | score |
|---|---|
{held}

## Speculative decoding
{_acceptance(t)}

## Quantization sensitivity
{sensitivity_table(qs)}

"""


REPRODUCING = """## Reproducing
- `python scripts/train_reference_model.py` trains the target and the drafter, then renders this card. It is
  resumable; `--init-from DIR` warm-starts, `--stop-at HH:MM` (UTC) is a time budget, `--smoke` runs a few steps.
- `python scripts/train_drafter.py` (resumable) re-distils the drafter against the committed target, whose weights
  it checks byte for byte.
- `python scripts/quant_sensitivity.py --run --write-card` re-measures "Scores on the test split" and
  "Quantization sensitivity" and renders this card again.
"""
