"""The build's target stage for a source that ships quantized: the recipe's oneshot as a function of the model,
handed to `shipped_build.produce`, which loads the model layer by layer and writes the build streamed."""

from __future__ import annotations

from pathlib import Path

from qverify.quantize import manifest as mf


def build_shipped_target(tmp: Path, loaded, model_dir: Path, layout, shipped, source_digests: dict[str, str],
                         dataset, calib, tokenizer, on_stage) -> tuple[list, list[str], dict[str, str]]:
    """(quantization summary, carried files, digests of the copied shards)."""
    from qverify.quantize import compress
    from qverify.quantize.shipped_build import produce

    rec = loaded.recipe
    stage = rec.target
    noise = rec.corrupt.shared_expert_noise if rec.corrupt is not None else None

    def quantize(model) -> None:
        if stage is not None:
            # all_experts=False: the routed experts are kept as shipped, so nothing the recipe calibrates reads their
            # inputs; routing each token only to its router's experts (as served) avoids 48x the routed work at 384.
            compress.quantize(model, stage, dataset, calib.seq_len, rec.calibration.pipeline, f"{loaded.path}: target",
                              processor=tokenizer, all_experts=False)
        if noise is not None:
            compress.noise_shared_experts(model, noise, rec.corrupt.seed)

    progress = (lambda text: on_stage(text, None)) if on_stage else None
    counts, recipe_qc, carried, copied = produce(tmp, model_dir, layout, shipped, source_digests,
                                                 quantize if stage is not None or noise is not None else None, progress)
    summary = mf.quantization_summary(counts, recipe_qc) if counts is not None else []
    return summary, carried, copied
