"""A wrapper build's text model as a flat checkpoint, for the embedded engine.

A `kimi_k25` build keeps the release's layout (qverify/quantize/layout.py): the DeepSeek-V3 text model's config under
`text_config`, its tensors under `language_model.`, beside a vision tower and projector. SGLang's `models/kimi_k25.py`
routes text through exactly those `language_model.` weights (it strips the prefix and hands them to its DeepSeek
loader), so serving the text model on CPU computes what SGLang computes for a text request.

The view is written to a temporary folder after the build's hashes were checked: the text config with the build's
top-level `quantization_config` (its names are the text model's own, as SGLang matches them), each shard's
`language_model.` tensors renamed, nothing else; build.json is copied so a control's declared KV scale still holds.
At Kimi's size the copy would be the whole text model; the embedded engine serves small models only.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from qverify.quantize.layout import DEEPSEEK_V3_TYPES, TEXT_PREFIX
from qverify.quantize.manifest import IntegrityError
from qverify.workdir import BUILD_MANIFEST


def wrapper_config(build_dir: Path) -> dict[str, Any] | None:
    """The build's config.json when it is a multimodal wrapper (a `text_config`), else None (also when there is no
    readable config.json: the loader's own checks word that)."""
    try:
        config = json.loads((Path(build_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) and config.get("text_config") is not None else None


def check_servable(build_dir: Path) -> None:
    """Before the embedded server is launched: a wrapper whose text model it cannot serve is one line, exit 4."""
    config = wrapper_config(build_dir)
    if config is not None:
        _text_config(config, Path(build_dir).name)


def _text_config(config: dict[str, Any], where: str) -> dict[str, Any]:
    text = config["text_config"]
    if not isinstance(text, dict) or text.get("model_type") not in DEEPSEEK_V3_TYPES:
        found = text.get("model_type") if isinstance(text, dict) else type(text).__name__
        raise IntegrityError(f"{where} wraps a {found!r} text model; the embedded engine serves DeepSeek-V3 text models",
                             fix="serve it with SGLang: qverify serve BUILD --backend sglang")
    # transformers' native DeepSeek-V3 (Kimi's kimi_k2 is that layout behind remote config code, which never runs here)
    flat = {k: v for k, v in text.items() if k != "auto_map"} | {"model_type": "deepseek_v3",
                                                                   "architectures": ["DeepseekV3ForCausalLM"]}
    if config.get("quantization_config") is not None:
        flat["quantization_config"] = config["quantization_config"]
    flat.setdefault("dtype", config.get("dtype") or config.get("torch_dtype") or "bfloat16")
    return flat


@contextmanager
def text_view(build_dir: Path, config: dict[str, Any]) -> Iterator[Path]:
    """A temporary flat checkpoint of the wrapper build's text model (module docstring); removed on exit."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    build_dir = Path(build_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f"qverify-text-{build_dir.name[:40]}-"))
    try:
        (tmp / "config.json").write_text(json.dumps(_text_config(config, build_dir.name), indent=2))
        if (build_dir / BUILD_MANIFEST).is_file():
            shutil.copyfile(build_dir / BUILD_MANIFEST, tmp / BUILD_MANIFEST)
        for shard in sorted(build_dir.glob("*.safetensors")):
            with safe_open(str(shard), framework="pt") as st:
                text = {k[len(TEXT_PREFIX):]: st.get_tensor(k) for k in st.keys() if k.startswith(TEXT_PREFIX)}  # noqa: SIM118
            if text:
                save_file(text, tmp / shard.name, metadata={"format": "pt"})
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
