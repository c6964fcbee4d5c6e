"""`qverify build`, `qverify builds`, `qverify verify-build`: serving builds and their integrity."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qverify.commands._common import BUILD_REF_HELP, ConfigOpt, Count, RecipeOpt, TrustOpt, state, trusted


def _quiet(verbose: bool) -> None:
    """Library chatter (progress bars, loguru, load reports) to the log file unless -v (qverify.logs)."""
    from qverify.logs import quiet_heavy_libraries

    quiet_heavy_libraries(verbose)


def build_cmd(
    ctx: typer.Context,
    recipe: RecipeOpt,
    model: Annotated[Path | None, typer.Option("--model", help="local HF model dir (default: the embedded qverify-tiny)")] = None,
    drafter: Annotated[Path | None, typer.Option("--drafter", help="drafter model dir (default: <model>/drafter if present)")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="build dir (default: <workdir>/builds/<build-id>)")] = None,
    calib_data: Annotated[str | None, typer.Option("--calib-data", help="mix (default), coding, toolcall, longctx, or a .jsonl/.parquet file")] = None,
    calib_samples: Annotated[int | None, typer.Option("--calib-samples", callback=Count, help="calibration samples (default: the recipe's)")] = None,
    calib_seq_len: Annotated[int | None, typer.Option("--calib-seq-len", callback=Count, help="tokens per calibration sample (default: the recipe's)")] = None,
    force: Annotated[bool, typer.Option("--force", help="rebuild even if the same build exists")] = False,
    trust_remote_code: TrustOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Build a serving build from a recipe with llm-compressor, then verify it loads exactly."""
    s = state(ctx)
    _quiet(s.verbose)
    from qverify.quantize.build import build

    # A spinner on a terminal; in a log (nohup, CI, a pipe) a spinner shows nothing, and a 1T build runs for an hour:
    # there each progress step (stage, "calibrate: layer k of n", "copy: shard i of n (x of y GB)") is its own line.
    status = s.out.err.status(f"building {recipe}") if not s.out.json_mode and s.out.err.is_terminal else None

    def on_stage(name: str, seconds: float | None) -> None:
        if s.out.json_mode:
            return
        if seconds is not None:
            s.out.err.print(f"  [green]✓[/green] {name} [dim]{seconds:.1f}s[/dim]")
        elif status is not None:
            status.update(f"[bold]{name}[/bold] …")
        else:
            s.out.err.print(f"  {name} …", highlight=False, markup=False)

    if status:
        status.start()
    try:
        res = build(recipe, model=model, drafter=drafter, workdir=s.workdir.root, out=out, calib_data=calib_data,
                    calib_samples=calib_samples, calib_seq_len=calib_seq_len, force=force,
                    trust_remote_code=trusted(trust_remote_code, config), on_stage=on_stage)
    finally:
        if status:
            status.stop()
    m = res.manifest
    s.out.data({"build_id": m.build_id, "build_dir": str(res.build_dir), "reused": res.reused, "recipe": m.recipe,
                "control": m.control, "kv_bytes_per_token": m.kv_bytes_per_token, "total_bytes": m.total_bytes,
                "seconds": res.seconds, "verify": res.verify.model_dump() if res.verify else None})
    if not s.out.json_mode:
        what = "reused existing build" if res.reused else "built and verified"
        s.out.console.print(f"{what}: [bold]{m.build_id}[/bold]  {res.build_dir}", highlight=False)
        for q in m.quantization:
            s.out.console.print(f"  {q.scheme}: {q.modules} modules, {q.params:,} params, {q.format}", highlight=False)
        s.out.console.print(f"  KV cache {m.kv_dtype}: {m.kv_bytes_per_token:,} bytes/token; weights {m.total_bytes:,} bytes",
                            highlight=False)


def _size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def builds_cmd(ctx: typer.Context) -> None:
    """List builds in the workdir: id, recipe, source, size, KV bytes/token, created."""
    from qverify.workdir import read_build_manifest

    s = state(ctx)
    rows, data = [], []
    root = s.workdir.builds
    for d in s.workdir.build_dirs():
        try:
            m = read_build_manifest(d)
        except ValueError:
            rows.append([d.name, "?", "invalid build.json", "", "", ""])
            continue
        size = _size(d)
        rows.append([m.build_id, m.recipe + (" (control)" if m.control else ""), m.source_model,
                     f"{size / 1e6:.1f} MB", m.kv_bytes_per_token, m.created])
        data.append({"build_id": m.build_id, "recipe": m.recipe, "control": m.control, "source": m.source_model,
                     "size_bytes": size, "kv_bytes_per_token": m.kv_bytes_per_token, "created": m.created, "dir": str(d)})
    s.out.table(f"builds ({root})", ["id", "recipe", "source", "size", "KV B/token", "created"], rows)
    s.out.data(data)
    if not rows and not s.out.json_mode:
        for line in ("no builds yet; make one with: qverify build --recipe NAME",
                     "(qverify recipes lists them; the default model is the embedded qverify-tiny)"):
            s.out.console.print(line, highlight=False, markup=False, soft_wrap=True)


def verify_build_cmd(
    ctx: typer.Context,
    build: Annotated[str, typer.Argument(help=BUILD_REF_HELP)],
    trust_remote_code: TrustOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Check a build's file/tensor hashes against build.json and reload it with the serving loader."""
    s = state(ctx)
    _quiet(s.verbose)
    from qverify.quantize.loader import verify_build

    report = verify_build(s.workdir.resolve_build(build)[0], trusted(trust_remote_code, config))
    s.out.data(report.model_dump())
    if not s.out.json_mode:
        s.out.console.print(f"[green]OK[/green] {report.build_id}: {report.hashed} hashes match build.json, "
                            f"{report.compared} reloaded tensors equal the checkpoint "
                            f"(target: {report.target_load}" + (f", drafter: {report.drafter_load}" if report.drafter_load else "")
                            + f"; {report.seconds:.1f}s)", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("build", help="Build a serving build from a recipe with llm-compressor.")(build_cmd)
    app.command("builds", help="List builds in the workdir.")(builds_cmd)
    app.command("verify-build", help="Check a build's load integrity and tensor hashes.")(verify_build_cmd)
