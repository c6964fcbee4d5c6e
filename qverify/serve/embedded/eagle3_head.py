"""An EAGLE3 drafter head as SGLang 0.5.23 runs it, on CPU: the module, its loading (bf16 or compressed-tensors
FP8) and one forward over new tokens.

What the head computes, per token (SGLang's `models/llama_eagle3.py` LlamaModel / LlamaDecoderLayer, and
`models/kimi_k25_eagle3.py` Eagle3MLAModel / Eagle3MLADecoderLayer, which differ only in the attention):
- `hidden` is either the target's captured hidden states (three layers' concatenated, width 3 x target hidden), put
  through `fc` (after the optional `input_norm` / per-chunk `fc_norm`), or the head's own output from the previous
  draft step (width = hidden: no fc; SGLang tells them apart by width the same way);
- residual = hidden; attention input = cat(input_layernorm(embed(token)), hidden_norm(hidden)) (2 x hidden wide);
- residual += o_proj(attention); residual += mlp(post_attention_layernorm(residual));
- logits = lm_head(norm(residual)) over the draft vocabulary, mapped to target ids by `d2t` (hot id = d2t[i] + i);
  the next step's hidden is `residual` (pre-norm), or the normed one with `norm_output`.
The embeddings are the target's (SGLang's EAGLE3 worker calls `set_embed` with the target's; the MLA head keeps its
own when its hidden size differs from the target's), and so is lm_head when the head declares no draft vocabulary.

Why hand-written and not a transformers model: transformers has no EAGLE3 class. The pieces are transformers' own
(LlamaAttention / DeepseekV3Attention projections, MLPs, RMSNorms, rotary embeddings) with the first projections
widened to 2 x hidden as SGLang widens them; the MLA head's attention is mla.py's (the target's own code). FP8 heads
load through compressed-tensors (apply_quantization_config, then its compressor's decompression), so their Linear
forward is compressed-tensors' own: FP8 weights, dynamic per-token FP8 activations.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import nn

from qverify.quantize.manifest import IntegrityError

# Checkpoint names -> this module's (SGLang's own legacy renames, llama_eagle3.load_weights).
_RENAMES = [(r"^model\.", ""), (r"^midlayer\.", "layers.0."), (r"^aux_norm_low\.", "fc_norm.0."),
            (r"^aux_norm_mid\.", "fc_norm.1."), (r"^aux_norm_high\.", "fc_norm.2.")]


def is_eagle3_head(module) -> bool:
    return isinstance(module, Eagle3Head)


def aux_layer_ids(head_config: dict, target_layers: int) -> list[int]:
    """The target layers whose inputs (the residual stream entering the layer) are concatenated, in layer order:
    SGLang's `DeepseekV2ForCausalLM.set_eagle3_layers_to_capture` (models/deepseek_v2.py) with the head's
    `eagle_config.eagle_aux_hidden_state_layer_ids` (+1 when they start at 1), else [2, N // 2, N - 3]; the
    captures are appended as the layers run (`AuxHiddenStatePacker`, layers/aux_hidden_states.py)."""
    ids = (head_config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") \
        or head_config.get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        ids = [2, target_layers // 2, target_layers - 3]
    elif ids and ids[0] == 1:
        ids = [i + 1 for i in ids]
    return sorted(set(ids))


class _Layer(nn.Module):
    def __init__(self, cfg, mla: bool):
        super().__init__()
        from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds
        from transformers.models.llama import modeling_llama as ll

        lib = ds if mla else ll
        hidden = cfg.hidden_size
        if mla:
            self.self_attn = ds.DeepseekV3Attention(cfg, 0)
            a = self.self_attn
            a.q_a_proj = nn.Linear(2 * hidden, cfg.q_lora_rank, bias=False)
            a.kv_a_proj_with_mqa = nn.Linear(2 * hidden, cfg.kv_lora_rank + cfg.qk_rope_head_dim, bias=False)
        else:
            self.self_attn = a = ll.LlamaAttention(cfg, 0)
            for name in ("q_proj", "k_proj", "v_proj"):
                old = getattr(a, name)
                setattr(a, name, nn.Linear(2 * hidden, old.out_features, bias=old.bias is not None))
        Norm = lib.DeepseekV3RMSNorm if mla else lib.LlamaRMSNorm
        self.mlp = (lib.DeepseekV3MLP if mla else lib.LlamaMLP)(cfg)
        self.input_layernorm, self.hidden_norm = Norm(hidden, cfg.rms_norm_eps), Norm(hidden, cfg.rms_norm_eps)
        self.post_attention_layernorm = Norm(hidden, cfg.rms_norm_eps)
        self.rotary_emb = (ds.DeepseekV3RotaryEmbedding if mla else ll.LlamaRotaryEmbedding)(cfg)


class Eagle3Head(nn.Module):
    """Parameter names are the checkpoint's after _RENAMES, so a state dict loads 1:1."""

    def __init__(self, config: dict, target, shapes: dict[str, tuple[int, ...]]):
        super().__init__()
        from transformers import DeepseekV3Config, LlamaConfig

        self.mla = bool(config.get("kv_lora_rank"))
        fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "quantization_config")}
        cfg = (DeepseekV3Config if self.mla else LlamaConfig)(**{"num_hidden_layers": 1, **fields})
        self.config = cfg
        if getattr(cfg, "tie_word_embeddings", False):
            raise IntegrityError("an EAGLE3 head with tied embeddings is not served by the embedded engine",
                                 fix="serve it with SGLang, or pass a head with its own lm_head")
        hidden, tcfg = cfg.hidden_size, target.config
        target_hidden = config.get("target_hidden_size") or hidden
        self.capture = aux_layer_ids(config, tcfg.num_hidden_layers)
        if not all(0 <= i < tcfg.num_hidden_layers for i in self.capture):
            raise IntegrityError(f"EAGLE3 head reads target layers {self.capture}; the target has {tcfg.num_hidden_layers}",
                                 fix="set eagle_config.eagle_aux_hidden_state_layer_ids in the head's config.json")
        n_aux = len(self.capture)
        fc_in = shapes.get("fc.weight", (0, target_hidden * n_aux))[1]
        if fc_in != target_hidden * n_aux:
            raise IntegrityError(f"EAGLE3 head: fc reads {fc_in} values, the target's layers {self.capture} give "
                                 f"{target_hidden * n_aux}", fix="pass the head trained for this target")
        self.fc = nn.Linear(fc_in, hidden, bias="fc.bias" in shapes)
        self.layers = nn.ModuleList([_Layer(cfg, self.mla)])
        Norm = type(self.layers[0].input_layernorm)
        self.norm = Norm(hidden, cfg.rms_norm_eps)
        self.input_norm = Norm(fc_in, cfg.rms_norm_eps) if "input_norm.weight" in shapes else None
        self.fc_norm = (nn.ModuleList(Norm(target_hidden, cfg.rms_norm_eps) for _ in range(n_aux))
                        if "fc_norm.0.weight" in shapes else None)
        self.norm_output = bool(config.get("norm_output", False))
        own_embed = "embed_tokens.weight" in shapes
        if own_embed:
            self.embed_tokens = nn.Embedding(*shapes["embed_tokens.weight"])
        # SGLang: the target's embeddings (set_embed), unless the head's hidden size differs from the target's
        self.use_own_embed = own_embed and target_hidden != hidden
        draft_vocab = config.get("draft_vocab_size")
        self.lm_head = nn.Linear(hidden, draft_vocab, bias=False) if draft_vocab is not None else None
        self.hot = None  # draft id -> target id (d2t + arange); None: the same vocabulary
        self._target = [target]  # (a list: not a submodule, so not part of the head's state dict)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return (self.embed_tokens if self.use_own_embed else self._target[0].get_input_embeddings())(ids)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return (self.lm_head or self._target[0].lm_head)(x).float()

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.hot is None else self.hot[draft_ids]

    def into_width(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's captured states -> the head's width (fc); the head's own output passes as is (SGLang's
        rule: fc when the width differs from the embeddings')."""
        if hidden.shape[-1] == self.fc.out_features:
            return hidden
        if self.input_norm is not None:
            hidden = self.input_norm(hidden)
        if self.fc_norm is not None:
            hidden = torch.cat([n(c) for n, c in zip(self.fc_norm, hidden.chunk(len(self.fc_norm), -1))], -1)
        return self.fc(hidden)


def _renamed(name: str) -> str:
    for pattern, new in _RENAMES:
        name = re.sub(pattern, new, name)
    return name


def load_eagle3_head(drafter_dir: Path, target, dtype: torch.dtype = torch.float32) -> Eagle3Head:
    """The head under `drafter_dir` (checked for SGLang by quantize.eagle3.check_eagle3 when the build loaded),
    every tensor loaded: a missing or unexpected one is an IntegrityError, never a random weight."""
    from safetensors.torch import load_file

    config = json.loads((drafter_dir / "config.json").read_text())
    tensors = {}
    for f in sorted(drafter_dir.glob("*.safetensors")):
        tensors |= {_renamed(k): v for k, v in load_file(f).items()}
    d2t = tensors.pop("d2t", None)
    tensors.pop("t2d", None)
    from llmcompressor.utils.dev import skip_weights_initialize

    with skip_weights_initialize():  # every weight is loaded below
        head = Eagle3Head(config, target, {k: tuple(v.shape) for k, v in tensors.items()})
    qc = config.get("quantization_config")
    compressor = None
    if qc:
        from compressed_tensors.compressors import ModelCompressor
        from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config

        qconfig = QuantizationConfig.model_validate(qc)
        apply_quantization_config(head, qconfig, run_compressed=False, show_progress=False)
        compressor = ModelCompressor(quantization_config=qconfig)
        compressor.compress_model(head)
    expected = set(head.state_dict())
    missing, unexpected = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
    missing = [k for k in missing if "rotary_emb" not in k]  # computed buffers, not weights
    for kind, keys in (("missing", missing), ("unexpected", unexpected)):
        if keys:
            raise IntegrityError(f"{drafter_dir.parent.name}/drafter: EAGLE3 head has {len(keys)} {kind} tensors "
                                 f"for the embedded engine, e.g. {keys[0]}", fix="pass a complete EAGLE3 checkpoint")
    head.load_state_dict(tensors, strict=False, assign=True)
    if compressor is not None:
        compressor.decompress_model(head)
    if d2t is not None:
        head.hot = d2t.long() + torch.arange(d2t.shape[0])
    for name, p in head.named_parameters():
        if p.is_floating_point() and p.dtype != torch.float8_e4m3fn:
            p.data = p.data.to(dtype)
    return head.eval().requires_grad_(False)
