"""`qverify capacity`: weights per GPU, free HBM, KV tokens per replica and sessions at a context length."""

from __future__ import annotations

from typing import Annotated

import typer

from qverify.commands._common import BUILD_REF_HELP, Count, ProfileOpt, RecipeOpt, TrustOpt, in_range, state


def capacity_cmd(
    ctx: typer.Context,
    build: Annotated[str | None, typer.Argument(help=BUILD_REF_HELP + ", or a checkpoint directory")] = None,
    model_config: Annotated[str | None, typer.Option("--model-config", help="model config.json, model dir, or a shipped name (kimi-k2.6), instead of a build")] = None,
    recipe: RecipeOpt = None,  # with --model-config (default bf16); a build already fixes its recipe
    gpu: Annotated[str, typer.Option("--gpu", help="b200, h200 or h100 (or any name with --hbm-gb)")] = "b200",
    profile: ProfileOpt = None,  # its tp, mem_fraction_static and launch flags
    tp: Annotated[int | None, typer.Option("--tp", callback=Count, help="tensor-parallel GPUs per replica (default: the profile's, else 1)")] = None,
    mem_fraction: Annotated[float | None, typer.Option("--mem-fraction", callback=in_range(gt=0, le=1, fix="pass a fraction such as 0.85"), help="SGLang --mem-fraction-static (default: the profile's, else SGLang's own default for the model and flags)")] = None,
    cuda_context_gb: Annotated[float | None, typer.Option("--cuda-context-gb", callback=in_range(ge=0, fix="pass 0 or more GB"), help="memory per GPU taken before weights load (CUDA context, NCCL); default 2.5 GiB")] = None,
    drafter_config: Annotated[str | None, typer.Option("--drafter-config", help="drafter/EAGLE3 head config.json (with --model-config)")] = None,
    context: Annotated[str, typer.Option("--context", help="tokens per session, e.g. 100k")] = "100k",
    weights_gb: Annotated[float | None, typer.Option("--weights-gb", callback=in_range(gt=0, fix="pass a size above 0 GB"), help="total weight GB, replacing the computed figure")] = None,
    hbm_gb: Annotated[float | None, typer.Option("--hbm-gb", callback=in_range(gt=0, fix="pass a size above 0 GB"), help="HBM per GPU in GB, replacing the table")] = None,
    # accepted so one command line grants trust on every command that takes a build (#40): capacity itself reads
    # only config.json and safetensors headers, never a build's code
    trust_remote_code: TrustOpt = False,
) -> None:
    """Plan KV capacity and weight memory for a build on a GPU type."""
    from qverify.capacity.planner import plan
    from qverify.capacity.sources import parse_context

    st = state(ctx)
    tp, mem_fraction, source, flags = _from_profile(profile, tp, mem_fraction)
    kwargs = _model_inputs(st.workdir, build, model_config, recipe, drafter_config)
    p = plan(**kwargs, gpu=gpu, tp=tp or 1, mem_fraction=mem_fraction, mem_fraction_source=source, launch_flags=flags,
             cuda_context_gb=cuda_context_gb, context=parse_context(context), weights_gb=weights_gb, hbm_gb=hbm_gb)
    st.out.data(p.model_dump())
    if not st.out.json_mode:
        _render(st.out, p)


def _from_profile(profile: str | None, tp: int | None, mem_fraction: float | None):
    """(tp, fraction, where the fraction came from, launch flags): the command line's, else the profile's."""
    if profile is None:
        return tp, mem_fraction, None, None
    from qverify.serve.profile import load_profile

    prof = load_profile(profile)
    source = None
    if mem_fraction is None and prof.flags.get("mem_fraction_static") is not None:
        mem_fraction, source = float(prof.flags["mem_fraction_static"]), f"profile {prof.name}"
    return (tp if tp is not None else prof.tp), mem_fraction, source, prof.flags


def _model_inputs(workdir, build: str | None, model_config: str | None, recipe: str | None,
                  drafter_config: str | None) -> dict:
    """plan()'s model arguments from a build (the workdir's one resolver; a plain checkpoint directory too) or from
    --model-config and a recipe."""
    from qverify.capacity.quantplan import quant_plan
    from qverify.capacity.sources import load_build, load_config
    from qverify.errors import BadInput

    if (build is None) == (model_config is None):
        raise BadInput("give exactly one of BUILD or --model-config",
                       fix="e.g. 'qverify capacity --model-config kimi-k2.6 --recipe nvfp4_experts --tp 4'")
    if build is None:
        cfg, name = load_config(model_config)
        return {"config": cfg, "quant": quant_plan(recipe or "bf16"), "model_name": name,
                "drafter_config": load_config(drafter_config)[0] if drafter_config else None}
    if recipe:
        raise BadInput("--recipe applies only with --model-config; a build already fixes its recipe",
                       fix="drop --recipe, or use --model-config with the build's config.json")
    if drafter_config:
        raise BadInput("--drafter-config applies only with --model-config; a build carries its own drafter/",
                       fix="drop --drafter-config")
    b = load_build(*_build_dir(workdir, build))
    return {"config": b.config, "quant": b.quant, "weights": b.weights, "drafter_config": b.drafter_config,
            "drafter_weights": b.drafter_weights, "model_name": b.name}


def _build_dir(workdir, ref: str):
    """(directory, BuildManifest or None): a checkpoint directory without build.json as it is, else the build
    through Workdir.resolve_build (id, unique prefix, recipe name or build directory)."""
    from pathlib import Path

    from qverify.workdir import is_build, manifest_path

    p = Path(ref)
    if p.is_dir() and not is_build(p) and not manifest_path(p).exists() and (p / "config.json").is_file():
        return p, None
    return workdir.resolve_build(ref)


def _render(out, p) -> None:
    from qverify.capacity.published import fmt_tokens

    gb = lambda b: f"{b / 1e9:,.2f} GB"
    w, m = p.weights, p.margin
    out.table(f"{p.model} · {p.recipe} · {p.tp}x {p.gpu}", ["", "value"], [r for r in [
        ["HBM per GPU", gb(p.hbm_bytes)],
        ["mem_fraction_static", f"{p.mem_fraction:.3f} ({p.mem_fraction_source})"],
        ["free before load (HBM - CUDA context/NCCL)", gb(p.pre_model_load_bytes)],
        ["held back: free before load x (1 - fraction)", gb(p.slack_bytes)],
        [f"weights ({w.source})", gb(w.total_bytes) + (f" + drafter {gb(p.drafter_weights_bytes)}" if p.drafter_weights_bytes else "")],
        ["weights per GPU (TP-replicated modules whole)", gb(p.weights_per_gpu_bytes)],
        ["loaded beside them: w_kc/w_vc copies of kv_b_proj", gb(p.mla_copies_per_gpu_bytes)] if p.mla_copies_per_gpu_bytes else None,
        ["KV pool per GPU", gb(p.free_per_gpu_bytes) + ("" if p.fits else "  (does not fit)")],
        [f"KV tokens per replica ({p.kv_dtype})", f"{p.kv_tokens_per_replica:,} ({fmt_tokens(p.kv_tokens_per_replica)})"
         + (f"; {m.tokens_per_gib_context:,} fewer per GiB more CUDA context" if p.fits else "")],
        [f"sessions at {p.context_tokens:,} tokens", f"{p.sessions_at_context:,}, {m.spare_tokens:,} tokens to spare"
         if p.fits else f"does not fit: fits from mem_fraction_static {m.fits_from_fraction:g}"],
    ] if r is not None])
    out.table("KV cache", ["kv dtype", "bytes per token", "per GPU", "tokens per replica", "sessions", "recipe"], [
        [o.kv_dtype, f"{o.bytes_per_token:,}", f"{o.rank_bytes_per_token:,}",
         fmt_tokens(o.tokens_per_replica), f"{o.sessions:,}", "*" if o.selected else ""] for o in p.kv
    ])
    if w.bytes_by_class:
        out.table("Weights by module class", ["class", "params", "scheme", "bytes"], [
            [c, f"{w.params_by_class.get(c, 0) / 1e9:,.3f} B", w.schemes.get(c, "bf16"), gb(b)] for c, b in w.bytes_by_class.items()
        ])
    out.bullets("Assumptions", p.assumptions)
    out.bullets("Notes", p.notes)


def register(app: typer.Typer) -> None:
    app.command("capacity", help="Plan KV capacity and weight memory for a build on a GPU type.")(capacity_cmd)
