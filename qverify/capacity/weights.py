"""Weight bytes: summed from a checkpoint's safetensors headers, or estimated from config.json.

The estimate counts parameters per module class and prices each class with its scheme
(qverify.capacity.schemes). Layouts covered: DeepSeek-V3 / Kimi K2 (MLA + routed and
shared experts), Llama-style dense GQA, and Mixtral / Qwen-MoE style experts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from qverify.capacity.schemes import LinearShape, linear_bytes
from qverify.errors import BadInput
from qverify.strict import Strict

# Classes made of Linear layers a recipe can quantize; the rest always stay bf16.
LINEAR_CLASSES: tuple[str, ...] = ("attention", "dense_mlp", "routed_experts", "shared_experts", "lm_head")


class WeightsEstimate(Strict):

    total_bytes: int
    source: Literal["config+recipe", "checkpoint", "override"]
    params_by_class: dict[str, int] = Field(default_factory=dict)
    bytes_by_class: dict[str, int] = Field(default_factory=dict)
    bytes_by_dtype: dict[str, int] = Field(default_factory=dict, description="checkpoint only")
    schemes: dict[str, str] = Field(default_factory=dict, description="module class -> scheme priced")

    @property
    def total_params(self) -> int:
        return sum(self.params_by_class.values())


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: multimodal wrappers (Kimi K2.5/K2.6) nest it in text_config."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def need(cfg: dict[str, Any], key: str) -> Any:
    value = cfg.get(key)
    if value is None:
        raise BadInput(f"config.json has no {key!r}", fix="pass a Hugging Face config.json of a decoder-only LLM")
    return value


def _mlp(hidden: int, inter: int, n: int = 1) -> list[LinearShape]:
    # gate_proj and up_proj (hidden -> inter) plus down_proj (inter -> hidden), SwiGLU
    return [LinearShape(out_features=inter, in_features=hidden, count=2 * n),
            LinearShape(out_features=hidden, in_features=inter, count=n)]


def _attention(cfg: dict[str, Any], hidden: int) -> tuple[list[LinearShape], int]:
    """One layer's attention Linears and its extra norm params."""
    heads = int(need(cfg, "num_attention_heads"))
    if cfg.get("kv_lora_rank"):  # MLA (DeepSeek-V2/V3, Kimi K2)
        kv_rank, rope = int(cfg["kv_lora_rank"]), int(need(cfg, "qk_rope_head_dim"))
        nope, v = int(need(cfg, "qk_nope_head_dim")), int(need(cfg, "v_head_dim"))
        q_rank = cfg.get("q_lora_rank")
        q = ([LinearShape(out_features=int(q_rank), in_features=hidden),
              LinearShape(out_features=heads * (nope + rope), in_features=int(q_rank))]
             if q_rank else [LinearShape(out_features=heads * (nope + rope), in_features=hidden)])
        shapes = q + [LinearShape(out_features=kv_rank + rope, in_features=hidden),
                      LinearShape(out_features=heads * (nope + v), in_features=kv_rank),
                      LinearShape(out_features=hidden, in_features=heads * v)]
        return shapes, kv_rank + (int(q_rank) if q_rank else 0)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    return [LinearShape(out_features=heads * head_dim, in_features=hidden),
            LinearShape(out_features=kv_heads * head_dim, in_features=hidden, count=2),
            LinearShape(out_features=hidden, in_features=heads * head_dim)], 0


def _is_moe_layer(cfg: dict[str, Any], i: int, n_routed: int) -> bool:
    if not n_routed:
        return False
    if i < int(cfg.get("first_k_dense_replace") or 0) or i in (cfg.get("mlp_only_layers") or []):
        return False
    freq = int(cfg.get("moe_layer_freq") or cfg.get("decoder_sparse_step") or 1)
    return (i - int(cfg.get("first_k_dense_replace") or 0)) % freq == 0


def vision_params(config: dict[str, Any]) -> tuple[int, int]:
    """(TP-sharded, TP-replicated) parameters of a Kimi K2.5/K2.6 MoonViT tower plus its projector; (0, 0) without one.

    As SGLang 0.5.23 builds it (srt/models/kimi_k25.py): each encoder layer's attention is a TP-sharded
    VisionAttention (use_qkv_parallel=True); its MLP2 (srt/models/kimi_vl_moonvit.py, use_tensor_parallel off),
    norms, patch and position embeddings and the K2VLMultiModalProjector's ReplicatedLinears sit whole on every
    GPU. Field names: the release's (vt_hidden_size, ...) or transformers' Kimi_K25VisionConfig (hidden_size, ...).
    """
    v = config.get("vision_config")
    if not isinstance(v, dict):
        return 0, 0
    get = lambda key, default: int(v.get(f"vt_{key}") or v.get(key) or default)
    # defaults: transformers 5.17's Kimi_K25VisionConfig (its docstring checkpoint is moonshotai/Kimi-K2.6)
    h, inter, layers = get("hidden_size", 1152), get("intermediate_size", 4304), get("num_hidden_layers", 27)
    patch = int(v.get("patch_size") or 14)
    pos = int(v.get("init_pos_emb_height") or v.get("pos_emb_height") or 64) * int(
        v.get("init_pos_emb_width") or v.get("pos_emb_width") or 64)
    mh, mw = v.get("merge_kernel_size") or (2, 2)
    merged, text = h * int(mh) * int(mw), int(v.get("text_hidden_size") or text_config(config).get("hidden_size") or h)
    sharded = layers * (4 * h * h + 4 * h)  # qkv + proj, with biases
    replicated = (layers * (2 * h * inter + inter + h + 4 * h)  # MLP2 fc0/fc1 with biases, two LayerNorms
                  + 3 * patch * patch * h + h + pos * h + 2 * h  # patch embedding, position embedding, final norm
                  + 2 * h + merged * merged + merged + merged * text + text)  # projector: pre_norm, linear_1, linear_2
    return sharded, replicated


def module_shapes(config: dict[str, Any]) -> tuple[dict[str, list[LinearShape]], dict[str, int]]:
    """Linear shapes per class, and the non-Linear params (embeddings, norms, router) per class."""
    cfg = text_config(config)
    hidden, layers = int(need(cfg, "hidden_size")), int(need(cfg, "num_hidden_layers"))
    vocab = int(need(cfg, "vocab_size"))
    n_routed = int(cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts") or 0)
    expert_inter = int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0)
    shared_inter = int(cfg.get("shared_expert_intermediate_size") or 0) or int(cfg.get("n_shared_experts") or 0) * expert_inter
    linears: dict[str, list[LinearShape]] = {c: [] for c in LINEAR_CLASSES}
    other = {"embeddings": vocab * hidden, "norms": hidden, "router": 0, "router_bias": 0}  # norms: the final norm
    attn, attn_norms = _attention(cfg, hidden)
    for i in range(layers):
        linears["attention"] += attn
        other["norms"] += 2 * hidden + attn_norms
        if _is_moe_layer(cfg, i, n_routed):
            linears["routed_experts"] += _mlp(hidden, expert_inter, n_routed)
            if shared_inter:
                linears["shared_experts"] += _mlp(hidden, shared_inter)
            other["router"] += n_routed * hidden
            # DeepSeek-V3's e_score_correction_bias (fp32 in its and llm-compressor's files); transformers'
            # config drops topk_method, so an n_routed_experts config without it is DeepSeek-V3 too
            if cfg.get("topk_method", "noaux_tc" if "n_routed_experts" in cfg else None) == "noaux_tc":
                other["router_bias"] += n_routed
        else:
            linears["dense_mlp"] += _mlp(hidden, int(need(cfg, "intermediate_size")))
    if not cfg.get("tie_word_embeddings", False):
        linears["lm_head"].append(LinearShape(out_features=vocab, in_features=hidden))
    other["vision"] = sum(vision_params(config))  # always bf16: the release and every recipe leave the tower alone
    return linears, other


def estimate_weights(config: dict[str, Any], schemes: dict[str, str]) -> WeightsEstimate:
    """Bytes per class: Linear classes priced with their scheme (default bf16), the rest bf16."""
    linears, other = module_shapes(config)
    bias = other.pop("router_bias")
    params = {c: sum(s.params for s in shapes) for c, shapes in linears.items()} | other
    params["router"] += bias
    by_class = {c: sum(linear_bytes(s, schemes.get(c, "bf16")) for s in shapes) for c, shapes in linears.items()}
    by_class |= {c: 2 * n for c, n in other.items()}
    by_class["router"] += 4 * bias
    used = {c: schemes.get(c, "bf16") for c in LINEAR_CLASSES if params[c]}
    return WeightsEstimate(total_bytes=sum(by_class.values()), source="config+recipe",
                           params_by_class={c: n for c, n in params.items() if n},
                           bytes_by_class={c: b for c, b in by_class.items() if b}, schemes=used)


def checkpoint_weights(model_dir: Path) -> WeightsEstimate:
    """Exact tensor bytes of every *.safetensors file directly in `model_dir` (headers only)."""
    from qverify.quantize.manifest import read_safetensors_header

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise BadInput(f"no *.safetensors in {model_dir}", fix="point at a checkpoint directory, or use --model-config CONFIG.json")
    by_dtype: dict[str, int] = {}
    for f in files:
        for meta in read_safetensors_header(f)[0].values():  # the one parser (quantize/manifest.py)
            begin, end = meta["data_offsets"]
            by_dtype[meta["dtype"]] = by_dtype.get(meta["dtype"], 0) + end - begin
    return WeightsEstimate(total_bytes=sum(by_dtype.values()), source="checkpoint", bytes_by_dtype=by_dtype)
