"""A source's config.json must describe its weights: checked before anything is built.

A config.json that lies about shapes (an edited hidden_size, a config from another size of the
model) used to fail deep in the load check as "a bug in qverify". It is the source's fault, so it
is bad input naming config.json. The model is built on the meta device (no memory, no weights)
and its tensor shapes compared with the safetensors headers (read without loading a tensor).
"""

from __future__ import annotations

from pathlib import Path

from qverify.errors import BadInput


def expected_shapes(path: Path) -> dict[str, tuple[int, ...]] | None:
    """Parameter shapes the config implies, or None when transformers cannot build it natively
    (a multimodal wrapper, remote code): the load check after the build covers those."""
    import json

    from qverify.quantize.eagle3 import is_eagle3

    if is_eagle3(json.loads((Path(path) / "config.json").read_text())):
        return None  # an EAGLE3 head is not the causal LM its config names (draft vocab, fc): eagle3.check_eagle3
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = AutoConfig.from_pretrained(path, trust_remote_code=False)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
    except Exception:  # noqa: BLE001 - any model this cannot build is checked later, by loading it
        return None
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_shapes(path: Path) -> None:
    """BadInput naming config.json when a stored tensor's shape differs from the one the config implies.

    Only names both sides know are compared: a quantized tensor (weight_packed) or experts stored one
    file per expert where the model fuses them are not the config's to describe.
    """
    want = expected_shapes(path)
    if not want:
        return
    from safetensors import safe_open

    for f in sorted(path.glob("*.safetensors")):
        with safe_open(f, framework="pt") as sf:
            for name in sf.keys():  # noqa: SIM118 -- safe_open has no __iter__
                if name in want and tuple(sf.get_slice(name).get_shape()) != want[name]:
                    got = tuple(sf.get_slice(name).get_shape())
                    raise BadInput(f"{path / 'config.json'} does not describe the weights: {name} is {list(got)} in "
                                   f"{f.name}, the config implies {list(want[name])}",
                                   fix="use the config.json that was saved with these weights")
