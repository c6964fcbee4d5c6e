"""The GPU acceptance run's host side (CPU): the embedded engine's per-token logprobs for the tokens SGLang served, the
bf16 noise the tolerance is made of, and the kimi_k25 fixture at Kimi's attention shapes. Pass/fail rules live in
acceptance_checks.py."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

# Kimi K2.x's attention (its config.json): 64 heads (16 per rank at TP4, what K2.6 runs on 4 x B200), q_lora 1536,
# qk_nope 128 + qk_rope 64 (the 192-wide MHA prefill head and 576-wide latent row of the production kernels),
# v 128, kv_lora 512. The rest of the fixture stays tiny (2 layers, 8 routed experts, hidden 256, random weights).
KIMI_ATTENTION = {"num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
                  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
KIMI_SIZE = {"layers": 2, "experts": 8, "hidden": 256}
PROMPTS = ["Write a Python function that merges two sorted lists.", "List the first ten prime numbers.",
           "Explain what a hash map is.", "Describe the water cycle.", "Summarise the rules of chess.",
           "Explain how TCP differs from UDP."]  # distinct first words: no two share a radix-cache page


def kimi_fixture(cache_root: Path) -> Path:
    """A kimi_k25 checkpoint (wrapper config, INT4 routed experts, Kimi's tokenizer) with Kimi's attention shapes,
    made on the host (tests/fixtures/kimi_k25.py), cached by its code and size."""
    from tests.fixtures.kimi_k25 import kimi_k25_dir

    return kimi_k25_dir(cache_root, attention=KIMI_ATTENTION, **KIMI_SIZE)


def flat_twin(wrapper: Path, out: Path) -> Path:
    """The kimi_k25 checkpoint's text model as a flat DeepSeek-V3 checkpoint (`language_model.` stripped, vision
    dropped, text_config as config): the same weights, which the embedded engine serves (it refuses wrapper builds)
    while SGLang serves the wrapper. Recipes build both alike (as_shipped copies, fp8kv adds a data-free KV scheme)."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    if (out / "config.json").is_file():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cfg = json.loads((wrapper / "config.json").read_text())
    text = cfg["text_config"] | {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                                 "quantization_config": cfg["quantization_config"]}
    (tmp / "config.json").write_text(json.dumps(text, indent=2))
    weights: dict = {}
    for f in sorted(wrapper.glob("*.safetensors")):
        weights |= {k.removeprefix("language_model."): v for k, v in load_file(f).items() if k.startswith("language_model.")}
    save_file(weights, tmp / "model.safetensors", metadata={"format": "pt"})
    for f in wrapper.iterdir():
        if f.is_file() and not f.name.startswith(("model", "config.json", "preprocessor")):
            shutil.copy2(f, tmp / f.name)
    tmp.rename(out)
    return out


def prompt_ids(tok) -> list[list[int]]:
    return [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]


def _runner(lm, fp8: bool, backend: str, scales: dict[int, float] | None):
    from qverify.serve.embedded.runner import ModelRunner

    return ModelRunner(lm.model, slots=2, fp8_kv=fp8 and lm.fp8_kv, sglang_scales=scales, attention_backend=backend)


@torch.no_grad()
def engine_logprobs(lm, prompt: list[int], out: list[int], *, backend: str, fp8: bool = True,
                    scales: dict[int, float] | None = None) -> list[float]:
    """The engine's logprob of each of `out`, computed as SGLang computed it: the first from the prompt's prefill,
    each later one from an absorbed decode step over the cache (prompt rows + the tokens before it)."""
    r = _runner(lm, fp8, backend, scales)
    kvs, logits = r.prefill([prompt], torch.tensor([len(prompt) - 1]))
    lps = [float(torch.log_softmax(logits[0], -1)[out[0]])]
    for j, t in enumerate(out[:-1]):
        logits = r.decode(torch.tensor([[t]]), torch.tensor([[len(prompt) + j]]), torch.tensor([j]),
                          [(kvs[0], torch.tensor([0]))])[0, 0]
        lps.append(float(torch.log_softmax(logits, -1)[out[j + 1]]))
    return lps


@torch.no_grad()
def engine_greedy(lm, prompt: list[int], n: int, *, backend: str, scales: dict[int, float] | None = None) -> list[int]:
    """n greedy tokens from the engine (the dry run's stand-in for SGLang's)."""
    r = _runner(lm, True, backend, scales)
    kvs, logits = r.prefill([prompt], torch.tensor([len(prompt) - 1]))
    out = [int(logits[0].argmax())]
    for j in range(n - 1):
        logits = r.decode(torch.tensor([[out[-1]]]), torch.tensor([[len(prompt) + j]]), torch.tensor([j]),
                          [(kvs[0], torch.tensor([0]))])[0, 0]
        out.append(int(logits.argmax()))
    return out


@torch.no_grad()
def bf16_noise(lm, prompt: list[int], out: list[int]) -> list[float]:
    """|logprob in fp32 - logprob in bf16| of each of `out`, the same build's HF forward teacher-forced on the
    prompt + out: the gap bf16 compute alone makes on this model and these tokens (acceptance_checks.tolerance)."""
    ids = torch.tensor([prompt + out])
    tgt = torch.tensor(out)
    at = torch.arange(len(prompt) - 1, len(prompt) + len(out) - 1)
    lp = []
    for model in (lm.model, copy.deepcopy(lm.model).to(torch.bfloat16)):
        logits = model(ids).logits[0, at].float()
        lp.append(torch.log_softmax(logits, -1).gather(1, tgt[:, None])[:, 0])
    return (lp[0] - lp[1]).abs().tolist()


def split_first(xs: list[float]) -> tuple[list[float], list[float]]:
    """(the first token's, the decoded tokens') values."""
    return xs[:1], xs[1:]


def gpu_flags() -> list[str]:
    """`qverify capacity`'s GPU: b200/h200/h100 by name, else the memory the GPU reports."""
    import subprocess

    out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout.splitlines()[0]
    name, mib = (x.strip() for x in out.split(","))
    for key in ("b200", "h200", "h100"):
        if key in name.lower():
            return ["--gpu", key]
    return ["--gpu", "gpu", "--hbm-gb", str(int(mib) * 2**20 / 1e9)]
