"""`build`: recipe → serving build, in explicit phases.

resolve → calibrate → oneshot (target, drafter) → write (tokenizer, recipe.yaml, build.json)
→ verify (the server's own loader) → publish (atomic rename of a temp dir).

The build id is a content hash of the inputs (source and drafter tensors, recipe,
calibration when used, library versions), so the same inputs give the same id and an
existing build is reused unless `force`. Nothing is written under the final name until
the build has verified: a killed or disk-full build leaves only a hidden temp dir.
"""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from qverify.errors import TRUST_FIX, BadInput, InfraError, disk_full, is_disk_full
from qverify.models import BuildManifest, content_hash
from qverify.quantize import eagle3_fp8
from qverify.quantize import manifest as mf
from qverify.quantize.eagle3 import check_eagle3, is_eagle3
from qverify.quantize.kv_scales import manifest_kv_scales, write_control_scale
from qverify.quantize.layout import read_layout
from qverify.quantize.loader import DRAFTER_DIR, VerifyReport, verify_build
from qverify.quantize.recipe import LoadedRecipe, load_recipe
from qverify.quantize.shards import weight_map
from qverify.quantize.shipped import read_shipped
from qverify.quantize.source import (
    carry_files,
    check_model_dir,
    copy_model,
    copy_tokenizer,
    files_hash,
    needs_remote_code,
)
from qverify.versions import BUILD_PACKAGES, package_versions
from qverify.workdir import Workdir, is_build, manifest_path

OnStage = Callable[[str, float | None], None]


@dataclass
class BuildResult:
    build_dir: Path
    manifest: BuildManifest
    reused: bool
    seconds: dict[str, float] = field(default_factory=dict)
    verify: VerifyReport | None = None


def _resolve_drafter(model: Path, drafter: Path | None, recipe: LoadedRecipe) -> Path | None:
    path = Path(drafter).expanduser() if drafter is not None else model / DRAFTER_DIR
    if drafter is not None or (path / "config.json").is_file():
        try:
            eagle = is_eagle3(json.loads((path / "config.json").read_text()))
        except (OSError, ValueError):
            eagle = False  # check_model_dir says what is wrong
        # a pre-quantized EAGLE3 head is accepted: check_eagle3 checks that SGLang can load its FP8 layers
        path = check_model_dir(path, "drafter", allow_quantized=eagle)
        if eagle:
            # a bad head is bad input: refuse it now
            checked = check_eagle3(path, json.loads((model / "config.json").read_text()))
            if recipe.recipe.drafter is not None:  # not a causal LM: qverify's data-free FP8 stage (eagle3_fp8.py)
                eagle3_fp8.stage_scheme(recipe.recipe.drafter, recipe.recipe.name)
                if checked["quantization"] != eagle3_fp8.BF16_HEAD_QUANTIZATION:
                    raise BadInput(f"recipe {recipe.recipe.name} quantizes the drafter, but {path} is already FP8",
                                   fix="pick the recipe without the drafter stage; the head is then carried as is")
        return path
    if recipe.recipe.serving.requires_drafter:
        raise BadInput(f"recipe {recipe.recipe.name} quantizes the drafter but {model} has no drafter/",
                       fix="pass --drafter DIR, or pick a recipe without a drafter stage")
    return None


@contextmanager
def _stage(name: str, on_stage: OnStage | None, seconds: dict[str, float]) -> Iterator[None]:
    if on_stage:
        on_stage(name, None)
    t0 = time.time()
    yield
    seconds[name] = round(time.time() - t0, 2)
    if on_stage:
        on_stage(name, seconds[name])


def clean_stale(out: Path) -> None:
    """Remove what builds of this output left when their process died: the temp dir (`.<id>.tmp-<pid>`), its
    scratch dir (`.tmp-<pid>.scratch`, llm-compressor's save on the streamed path) and a replaced build being
    swapped out (`.<id>.old-<pid>`). A running build's dirs are kept."""
    pattern = re.compile(rf"^\.{re.escape(out.name)}\.(?:tmp|old)-(\d+)(?:\.scratch)?$")
    for p in out.parent.glob(f".{out.name}.*"):
        m = pattern.match(p.name)
        if m is None:
            continue
        try:
            os.kill(int(m[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(p, ignore_errors=True)
        except PermissionError:  # another user's live process
            pass


def _dtype_name(config: dict) -> str:
    d = str(config.get("dtype") or config.get("torch_dtype") or "bfloat16")
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(d, d)


@dataclass
class _Inputs:
    """What `resolve` found: the recipe, the sources and the build's id and folder."""

    loaded: LoadedRecipe
    model_dir: Path
    layout: object
    shipped: object
    drafter_dir: Path | None
    source_hash: str
    source_digests: dict
    calib: object
    versions: dict
    build_id: str
    out_dir: Path


def build(recipe: str | Path, *, model: Path | str | None = None, drafter: Path | str | None = None,
          workdir: Path | str = ".qverify", out: Path | str | None = None, calib_data: str | None = None,
          calib_samples: int | None = None, calib_seq_len: int | None = None, force: bool = False,
          trust_remote_code: bool = False, on_stage: OnStage | None = None) -> BuildResult:
    """Build (or reuse) a serving build. Bad input → BadInput; disk full or a fresh build failing its load check →
    InfraError."""
    seconds: dict[str, float] = {}
    with _stage("resolve", on_stage, seconds):
        inp = _resolve(recipe, model, drafter, workdir, out, calib_data, calib_samples, calib_seq_len, trust_remote_code)
        reused = reuse_existing(inp.out_dir, inp.build_id, force)
        if reused is not None:
            return BuildResult(inp.out_dir, reused, reused=True, seconds=seconds)
    out_dir = inp.out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(out_dir)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        summary, carried, copied = _produce(tmp, inp.loaded, inp.model_dir, inp.drafter_dir, inp.calib, inp.shipped,
                                            trust_remote_code, on_stage, seconds, inp.layout, inp.source_digests)
        with _stage("write", on_stage, seconds):
            manifest = _write_manifest(tmp, inp, summary, carried, copied, trust_remote_code)
        with _stage("verify", on_stage, seconds):
            report = _verify(tmp, inp, trust_remote_code)
        with _stage("publish", on_stage, seconds):
            publish(tmp, out_dir)
        report.build_dir = str(out_dir)
        return BuildResult(out_dir, manifest, reused=False, seconds=seconds, verify=report)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, Exception) and is_disk_full(e):
            raise disk_full(f"disk full while writing the build under {out_dir.parent}; nothing was kept",
                            fix="free space, or pass --out DIR on a bigger disk") from None
        raise


def _resolve(recipe, model, drafter, workdir, out, calib_data, calib_samples, calib_seq_len,
             trust_remote_code: bool) -> _Inputs:
    """The recipe and sources, checked, and the build id: a content hash of everything the build depends on."""
    from qverify.assets import default_model_dir
    from qverify.quantize.calibration import load_calibration, source_chat_template

    loaded = load_recipe(recipe)
    rec = loaded.recipe
    model_dir = check_model_dir(Path(model or default_model_dir()).expanduser(), "model", default=model is None,
                                allow_quantized=True)
    if needs_remote_code(model_dir) and not trust_remote_code:
        raise BadInput(f"{model_dir} needs remote code (auto_map, e.g. tokenization_kimi.py)", fix=TRUST_FIX)
    config = json.loads((model_dir / "config.json").read_text())
    layout = read_layout(model_dir, config, list(weight_map(model_dir)))  # a wrapper it cannot build: refused here
    shipped = read_shipped(model_dir, config)
    if layout.wrapper and shipped is None:
        raise BadInput(f"{model_dir} is a {layout.wrapper!r} wrapper without a compressed-tensors quantization_config; "
                       "qverify builds wrappers as released (Kimi K2.5/K2.6: INT4 routed experts)",
                       fix="pass the release as published")
    drafter_dir = _resolve_drafter(model_dir, Path(drafter) if drafter else None, loaded)
    source_hash, source_digests = mf.model_hash(model_dir)
    calib = None
    if rec.target or rec.drafter:
        calib = load_calibration(calib_data, calib_samples or rec.calibration.samples,
                                 calib_seq_len or rec.calibration.seq_len, source_chat_template(model_dir))
    vers = package_versions(BUILD_PACKAGES)
    key = _build_key(rec, source_hash, model_dir, drafter_dir, calib, vers, trust_remote_code)
    build_id = f"{rec.name}-{content_hash(key, 12)}"
    out_dir = Path(out).expanduser().resolve() if out else Workdir.at(workdir).build_dir(build_id)
    return _Inputs(loaded, model_dir, layout, shipped, drafter_dir, source_hash, source_digests, calib, vers,
                   build_id, out_dir)


def _build_key(rec, source_hash: str, model_dir: Path, drafter_dir: Path | None, calib, vers: dict,
               trust_remote_code: bool) -> dict:
    key = {"source": source_hash, "drafter": mf.model_hash(drafter_dir)[0] if drafter_dir else None,
           "recipe": rec.digest, "versions": vers,
           "calibration": calib.describe() | {"source": None} if calib else None,
           # config.json, chat template, tokenizer: what is served besides the tensors (#31: they were ignored)
           "files": {"target": files_hash(model_dir), "drafter": files_hash(drafter_dir)}}
    if trust_remote_code:  # only when set, so ids of existing builds do not change
        key["trust_remote_code"] = True
    if rec.serving.kv_cache_dtype == "fp8_e4m3":  # FP8-KV builds before issue #28 carried a scale SGLang loads
        # (kv_scales.py), and before #27 a calibrated pair (compress.split_kv): a new id, so a cached old one is
        # never reused
        key["kv_scales"] = "uncalibrated-scale-one"
    return key


def _write_manifest(tmp: Path, inp: _Inputs, summary, carried, copied, trust_remote_code: bool) -> BuildManifest:
    """build.json: what was applied (the summary of the quantized model, not the recipe's words)."""
    rec, calib, drafter_dir = inp.loaded.recipe, inp.calib, inp.drafter_dir
    config = json.loads((tmp / "config.json").read_text())
    kv_dtype = "fp8_e4m3" if rec.serving.kv_cache_dtype == "fp8_e4m3" else _dtype_name(config)
    by_dtype = mf.bytes_by_dtype(tmp)
    manifest = BuildManifest(
        build_id=inp.build_id, recipe=rec.name, recipe_hash=rec.digest, recipe_text=inp.loaded.text,
        source_model=str(inp.model_dir), source_hash=inp.source_hash,
        drafter=str(drafter_dir) if drafter_dir else None,
        calibration=(calib.describe() | {"used_by": [s for s in ("target", "drafter") if getattr(rec, s)],
                                         "pipeline": rec.calibration.pipeline}) if calib else {},
        versions=inp.versions, quantization=summary,
        serving=mf.applied_serving(rec.serving.model_dump(mode="json"), summary, inp.shipped is not None),
        bytes_by_dtype=by_dtype, total_bytes=sum(by_dtype.values()), kv_dtype=kv_dtype,
        kv_bytes_per_token=mf.kv_bytes_per_token(config, kv_dtype), tensor_hashes=mf.hash_dir(tmp, known=copied),
        control=rec.control, trust_remote_code=trust_remote_code,
        kv_scales=manifest_kv_scales(kv_dtype.startswith("fp8"), _control_k_scale(rec)),
        source_quantization=inp.shipped.describe() if inp.shipped else None, carried_files=carried,
        drafter_kind="eagle3" if drafter_dir and is_eagle3(json.loads((drafter_dir / "config.json").read_text()))
        else "causal-lm")
    if manifest.drafter_kind == "eagle3":  # what SGLang must be told: --speculative-draft-model-quantization
        head = json.loads((tmp / DRAFTER_DIR / "config.json").read_text())
        manifest.serving["draft_model_quantization"] = eagle3_fp8.head_quantization(head)
    manifest_path(tmp).write_text(manifest.model_dump_json(indent=2))
    return manifest


def _verify(tmp: Path, inp: _Inputs, trust_remote_code: bool) -> VerifyReport:
    try:
        return verify_build(tmp, trust_remote_code,
                            source_digests=inp.source_digests if inp.shipped is not None else None)
    except mf.IntegrityError as e:  # a fresh build that does not reload exactly is our failure, not the user's
        raise InfraError(f"the new build failed its load check and was discarded: {e}",
                         fix="report it with the recipe and model (run with -v for the traceback)") from e


def reuse_existing(out_dir: Path, build_id: str, force: bool) -> BuildManifest | None:
    if not out_dir.exists() or force:
        return None
    if not is_build(out_dir):
        raise BadInput(f"{out_dir} exists and is not a qverify build", fix="pass --force to replace it, or another --out")
    manifest = mf.read_manifest(out_dir)
    if manifest.build_id != build_id:
        raise BadInput(f"{out_dir} holds another build ({manifest.build_id})", fix="pass --force to replace it, or another --out")
    mf.check_hashes(out_dir, manifest)  # never hand back a tampered build as "reused"
    return manifest


def publish(tmp: Path, out_dir: Path) -> None:
    old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
    if out_dir.exists():
        out_dir.rename(old)
    tmp.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)


def _produce(tmp: Path, loaded: LoadedRecipe, model_dir: Path, drafter_dir: Path | None, calib, shipped,
             trust_remote_code: bool, on_stage, seconds, layout=None, source_digests=None):
    """Write the target (and drafter) into tmp; returns (what the recipe changed, the carried file names,
    {'file::tensor': sha256} of shards hashed while copied)."""
    rec = loaded.recipe
    run = _Run(loaded, calib, None, None, trust_remote_code, on_stage, seconds)
    if calib is not None:
        run.dataset, run.tokenizer = _calibration_set(run, model_dir)
    summary, carried, copied = [], [], {}
    for which, src, dst in (("target", model_dir, tmp), ("drafter", drafter_dir, tmp / DRAFTER_DIR)):
        if src is None:
            continue
        noise = rec.corrupt.shared_expert_noise if which == "target" and rec.corrupt is not None else None
        if which == "target" and shipped is not None:  # a release that ships quantized: layer by layer, streamed
            part, carried, copied = _shipped_target(run, tmp, model_dir, shipped, layout, source_digests, noise)
            summary += part
            continue
        part, names = _write_model(run, which, src, dst, noise)
        summary += part
        names += carry_files(src, dst)
        if which == "target":
            carried = names
        else:
            copy_tokenizer(src, model_dir, dst)
    (tmp / "recipe.yaml").write_text(loaded.recipe.resolved_yaml())
    return summary, carried, copied


@dataclass
class _Run:
    """What every step of `_produce` reads: the recipe, the calibration set and where stages are reported."""

    loaded: LoadedRecipe
    calib: object
    dataset: object
    tokenizer: object
    trust_remote_code: bool
    on_stage: OnStage | None
    seconds: dict[str, float]

    def stage(self, name: str) -> AbstractContextManager[None]:
        return _stage(name, self.on_stage, self.seconds)


def _calibration_set(run: _Run, model_dir: Path) -> tuple[object, object]:
    """(the calibration dataset, the source's tokenizer)."""
    with run.stage("calibrate"):
        from transformers import AutoTokenizer

        from qverify.quantize.calibration import to_dataset

        tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=run.trust_remote_code)
        return to_dataset(run.calib, tokenizer), tokenizer


def _shipped_target(run: _Run, tmp: Path, model_dir: Path, shipped, layout, source_digests, noise):
    """The target of a release that ships quantized; returns (its summary, the carried names, the copied digests)."""
    from qverify.quantize.shipped_target import build_shipped_target

    rec = run.loaded.recipe
    with run.stage("build target" if rec.target is None and noise is None else "oneshot target"):
        part, carried, copied = build_shipped_target(tmp, run.loaded, model_dir, layout, shipped, source_digests,
                                                     run.dataset, run.calib, run.tokenizer, run.on_stage)
    qc = json.loads((tmp / "config.json").read_text()).get("quantization_config")
    if (qc or {}).get("kv_cache_scheme") and _control_k_scale(rec) is not None:  # the badscale control only
        write_control_scale(tmp, _control_k_scale(rec))
    return part, carried, copied


def _write_model(run: _Run, which: str, src: Path, dst: Path, noise) -> tuple[list, list[str]]:
    """Write one model (target or drafter) of a source release: noised, copied, its EAGLE3 head in fp8, or
    quantized. Returns (what the recipe changed, the names copied)."""
    from qverify.quantize import compress

    stage = getattr(run.loaded.recipe, which)
    if stage is None and noise is not None:
        with run.stage("noise shared experts"):
            model = compress.load_source(src, run.trust_remote_code)
            compress.noise_shared_experts(model, noise, run.loaded.recipe.corrupt.seed)
            model.save_pretrained(dst)
            del model
            gc.collect()
        return [], []
    if stage is None:
        with run.stage(f"copy {which}"):
            return [], copy_model(src, dst)
    if which == "drafter" and is_eagle3(json.loads((src / "config.json").read_text())):
        with run.stage("fp8 eagle3 head"):
            return eagle3_fp8.quantize_head(src, dst), []
    with run.stage(f"oneshot {which}"):
        return _oneshot(run, which, src, dst, stage, noise), []


def _oneshot(run: _Run, which: str, src: Path, dst: Path, stage, noise) -> list:
    """Quantize one model with llm-compressor's oneshot and save it; returns what the recipe changed."""
    from qverify.quantize import compress

    rec = run.loaded.recipe
    model = compress.load_source(src, run.trust_remote_code)
    compress.quantize(model, stage, run.dataset, run.calib.seq_len, rec.calibration.pipeline,
                      f"{run.loaded.path}: {which}", processor=run.tokenizer)
    if noise is not None:
        compress.noise_shared_experts(model, noise, rec.corrupt.seed)
    counts = mf.module_counts(model)  # before saving: save compresses weights in place
    compress.save(model, dst)
    qc = json.loads((dst / "config.json").read_text()).get("quantization_config")
    # SGLang needs no KV scale (kv_scales.py): only the badscale control writes one it loads
    if which == "target" and (qc or {}).get("kv_cache_scheme") and _control_k_scale(rec) is not None:
        write_control_scale(dst, _control_k_scale(rec))
    del model
    gc.collect()
    return mf.quantization_summary(counts, qc, prefix="" if which == "target" else "drafter:")


def _control_k_scale(rec) -> float | None:
    return rec.corrupt.sglang_k_scale if rec.corrupt is not None else None
