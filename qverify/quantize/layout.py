"""Where a checkpoint's text model sits: a flat DeepSeek-V3, or a multimodal wrapper around one.

Kimi K2.5/K2.6 ship as `kimi_k25`: the DeepSeek-V3 text model's config under `text_config`, its tensors under
`language_model.` (`language_model.model.layers.*`, `language_model.lm_head.*`), beside a vision tower and a
projector the recipes never touch. SGLang's `models/kimi_k25.py` strips `language_model.` and hands the rest to its
DeepSeek loader, so a build calibrates and quantizes the text model alone and keeps every name as shipped.

Any wrapper laid out that way works; anything else is refused here, before a byte is hashed or copied.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qverify.errors import BadInput

TEXT_PREFIX = "language_model."
# The text model's model_types that are DeepSeek-V3 underneath (Kimi K2.x ships `kimi_k2` + remote config code).
DEEPSEEK_V3_TYPES = ("deepseek_v3", "kimi_k2")


@dataclass(frozen=True)
class Layout:
    """The text model inside a checkpoint: its config and the prefix of its tensor names."""

    text: dict[str, Any]  # the text model's config.json content
    prefix: str = ""  # "" for a flat checkpoint, "language_model." for a kimi_k25-style wrapper
    wrapper: str | None = None  # the wrapper's model_type

    def text_name(self, name: str) -> str | None:
        """The text model's own name for a checkpoint tensor; None for the wrapper's other parts (vision, ...)."""
        return name[len(self.prefix):] if name.startswith(self.prefix) else None

    def full_name(self, text_name: str) -> str:
        return self.prefix + text_name


def _is_deepseek_v3(cfg: dict[str, Any]) -> bool:
    return cfg.get("model_type") in DEEPSEEK_V3_TYPES or "DeepseekV3ForCausalLM" in (cfg.get("architectures") or [])


def read_layout(model_dir: Path, config: dict[str, Any], names: list[str]) -> Layout:
    """The layout of `model_dir` (config.json `config`, tensor `names`); BadInput naming what was found otherwise."""
    text = config.get("text_config")
    if text is None:
        return Layout(text=config)
    what = f"{model_dir} is a {config.get('model_type')!r} wrapper ({', '.join(config.get('architectures') or [])})"
    if not isinstance(text, dict) or not _is_deepseek_v3(text):
        found = text.get("model_type") if isinstance(text, dict) else type(text).__name__
        raise BadInput(f"{what} around a {found!r} text model; qverify builds wrappers around DeepSeek-V3 only",
                       fix="pass the text model as a flat checkpoint, or a kimi_k25-style release")
    layers = [n for n in names if n.startswith(f"{TEXT_PREFIX}model.layers.")]
    if not layers:
        tops = sorted({n.split(".", 2)[0] + "." + n.split(".", 2)[1] for n in names if n.count(".") >= 2})
        raise BadInput(f"{what}, but its text tensors are not under {TEXT_PREFIX}model.layers. "
                       f"(found prefixes: {', '.join(tops[:6])})",
                       fix="rename them as the kimi_k25 release does (language_model.model.layers.*, language_model.lm_head.*)")
    return Layout(text=text, prefix=TEXT_PREFIX, wrapper=str(config.get("model_type")))

