"""The calibration model of a source that ships quantized routed experts, one decoder layer of them at a time.

At 1T parameters (Kimi K2.6: 1.026T, 595 GB packed) the dequantized routed experts alone are ~2 TB of bf16, more than
a node's host RAM. So the model is built on the meta device, everything but the routed experts is loaded from the
source (bf16, as shipped), and each routed expert weight is a zero-storage stand-in of its shape. A forward pre-hook
on each decoder layer dequantizes that layer's experts from the source's packed tensors when the layer runs (llm-
compressor's sequential pipeline runs one layer at a time over all samples, the basic pipeline layer after layer)
and puts the previous layer's stand-ins back: peak host RAM is the non-routed model plus one layer of experts.
compressed-tensors 0.19 has no run-compressed path for pack-quantized weights, hence the hook.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from qverify.errors import BadInput
from qverify.quantize.layout import Layout
from qverify.quantize.shipped import Shipped, dequantize

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
Progress = Callable[[str], None]


def _text_config(layout: Layout):
    from transformers import DeepseekV3Config

    drop = ("model_type", "auto_map", "quantization_config", "architectures")
    return DeepseekV3Config(**{k: v for k, v in layout.text.items() if k not in drop})


def _meta_model(config, dtype):
    """The text model on the meta device, its fused experts replaced by llm-compressor's per-expert Linear modules
    (built empty: `linearize_moe` would copy from the meta weights, which have no data)."""
    import torch
    from llmcompressor.modeling.moe.linear_experts import LinearExperts2D
    from llmcompressor.modeling.moe.linearize import get_non_linearized_moes
    from llmcompressor.utils.dev import skip_weights_initialize
    from transformers import AutoModelForCausalLM

    with torch.device("meta"), skip_weights_initialize():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        for name, module in get_non_linearized_moes(model):
            linear = LinearExperts2D.get_linear_experts_cls(type(module))(getattr(module, "config", config))
            linear._source_experts_cls, linear._source_config = type(module), config  # as linearize_moe records them
            model.set_submodule(name, linear)
    return model


def _stand_in(shape, dtype):
    """A weight of the right shape and no storage (one element, expanded): what the model holds between layers."""
    import torch

    return torch.nn.Parameter(torch.zeros((), dtype=dtype).expand(shape), requires_grad=False)


class LayerOnloader:
    """Dequantizes one decoder layer's routed experts as the layer runs; puts stand-ins back for the previous one."""

    def __init__(self, model, model_dir: Path, layout: Layout, shipped: Shipped, dtype, progress: Progress | None):
        self.model, self.dir, self.layout, self.shipped, self.dtype = model, model_dir, layout, shipped, dtype
        self.progress, self.current, self.handles = progress, None, []
        self.by_layer: dict[int, list[str]] = {}
        for module in shipped.modules:
            text = layout.text_name(module)
            if text is not None and (m := _LAYER.match(text)):
                self.by_layer.setdefault(int(m[1]), []).append(text)
        layers = model.model.layers
        self.n = len(layers)
        for i in self.by_layer:
            self.handles.append(layers[i].register_forward_pre_hook(self._hook(i)))

    def _hook(self, i: int):
        def pre(_module, _args):
            if self.current != i:
                self.release()
                self.onload(i)
        return pre

    def onload(self, i: int) -> None:
        from contextlib import ExitStack

        from safetensors import safe_open

        if self.progress:
            self.progress(f"calibrate: layer {i + 1} of {self.n} (dequantizing {len(self.by_layer[i])} experts' weights)")
        # One module's packed tensors at a time (not the whole layer's: 0.28x a layer of bf16 experts held at the peak)
        with ExitStack() as files:
            opened: dict[str, object] = {}
            for text in self.by_layer[i]:
                full, packed = self.layout.full_name(text), {}
                for t in self.shipped.modules[full]:
                    shard = self.shipped.shard_of[t]
                    if shard not in opened:
                        opened[shard] = files.enter_context(safe_open(self.dir / shard, "pt"))
                    packed[t.rsplit(".", 1)[1]] = opened[shard].get_tensor(t)
                _set_weight(self.model.get_submodule(text), dequantize(full, packed, self.shipped.config, self.dtype))
        self.current = i

    def release(self) -> None:
        if self.current is None:
            return
        for text in self.by_layer[self.current]:
            m = self.model.get_submodule(text)
            _set_weight(m, _stand_in(m.weight.shape, self.dtype))
        self.current = None
        _trim()

    def close(self) -> None:
        self.release()
        for h in self.handles:
            h.remove()


def _trim() -> None:
    """Hand the freed layer back to the OS. glibc keeps freed heap memory (a K2.6 expert weight, 29 MB, is under its
    32 MB mmap threshold), so without this the process's RSS would keep the high-water of several layers."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    name = ctypes.util.find_library("c")
    if name:
        try:
            ctypes.CDLL(name).malloc_trim(0)
        except (OSError, AttributeError):  # not glibc: nothing to trim
            pass


def _set_weight(module, t) -> None:
    """Replace (not copy into) a module's weight. Under oneshot the module's parameters sit in compressed-tensors'
    OffloadCache, whose assignment copies into the old tensor: a stand-in has no room, so the entry is removed first."""
    import torch

    if "weight" in module._parameters:
        del module._parameters["weight"]
    module.weight = t if isinstance(t, torch.nn.Parameter) else torch.nn.Parameter(t, requires_grad=False)


def _load_unshipped(model, model_dir: Path, layout: Layout, shipped: Shipped, expected: set[str],
                    progress: Progress | None) -> set[str]:
    """Assign every text-model tensor the release does not ship quantized into `model`, shard by shard; returns
    their text-model names."""
    from safetensors import safe_open

    shipped_tensors, loaded = shipped.tensors(), set()
    for shard in sorted(model_dir.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            state = {}
            for name in f.keys():  # noqa: SIM118 -- safe_open has no __iter__
                text = layout.text_name(name)
                if text is None or name in shipped_tensors:
                    continue
                if text not in expected:
                    raise BadInput(f"{model_dir}: tensor {name} has no place in the DeepSeek-V3 text model",
                                   fix="pass a complete Hugging Face checkpoint of this architecture")
                state[text] = f.get_tensor(name)
        model.load_state_dict(state, strict=False, assign=True)
        loaded |= set(state)
        if progress:
            progress(f"load: {shard.name} ({len(state)} tensors)")
    return loaded


def load_layerwise(model_dir: Path, layout: Layout, shipped: Shipped, progress: Progress | None = None):
    """(model, onloader): the text model with every non-routed tensor loaded and routed experts as stand-ins."""
    import torch

    from qverify.quantize.shipped import _native_config_dir

    config = _text_config(layout)
    dtype = getattr(config, "dtype", None) or torch.bfloat16
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    _native_config_dir(config)  # oneshot re-reads config.json from name_or_path
    model = _meta_model(config, dtype)
    expected = model.state_dict()
    loaded = _load_unshipped(model, model_dir, layout, shipped, set(expected), progress)
    for module in shipped.modules:
        text = layout.text_name(module)
        if text is not None:
            m = model.get_submodule(text)
            _set_weight(m, _stand_in(m.weight.shape, dtype))
            loaded.add(f"{text}.weight")
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing = sorted(set(expected) - loaded - tied)
    if missing:
        raise BadInput(f"{model_dir}: the checkpoint does not fill its text model ({missing[0]})",
                       fix="pass a complete Hugging Face checkpoint")
    # Non-persistent buffers (the rotary frequencies) are computed at construction: build them on the CPU.
    rotary = model.model.rotary_emb
    model.model.rotary_emb = type(rotary)(config=config)
    model.tie_weights()
    still = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if still:
        raise BadInput(f"{model_dir}: {still[0]} was not loaded", fix="pass a complete Hugging Face checkpoint")
    return model.eval(), LayerOnloader(model, model_dir, layout, shipped, dtype, progress)
