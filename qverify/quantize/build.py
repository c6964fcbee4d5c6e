"""`build`: recipe → serving build, in explicit phases.

resolve → calibrate → oneshot (target, drafter) → write (tokenizer, recipe.yaml, build.json)
→ verify (the server's own loader) → publish (atomic rename of a temp dir).

The build id is a content hash of the inputs (source and drafter tensors, recipe,
calibration when used, library versions), so the same inputs give the same id and an
existing build is reused unless `force`. Nothing is written under the final name until
the build has verified: a killed or disk-full build leaves only a hidden temp dir.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from qverify.errors import BadInput, InfraError
from qverify.models import BuildManifest, content_hash
from qverify.quantize import manifest as mf
from qverify.quantize.loader import DRAFTER_DIR, VerifyReport, verify_build
from qverify.quantize.recipe import LoadedRecipe, load_recipe
from qverify.workdir import Workdir, is_build, manifest_path

OnStage = Callable[[str, float | None], None]
_MODEL_FILES = ("config.json", "generation_config.json")
_TOKENIZER_PREFIXES = ("tokenizer", "special_tokens_map", "chat_template", "added_tokens", "vocab", "merges")
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


@dataclass
class BuildResult:
    build_dir: Path
    manifest: BuildManifest
    reused: bool
    seconds: dict[str, float] = field(default_factory=dict)
    verify: VerifyReport | None = None


def versions() -> dict[str, str]:
    out = {}
    for pkg in ("qverify", "torch", "transformers", "llmcompressor", "compressed-tensors"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "missing"
    return out


def check_model_dir(path: Path, what: str, default: bool = False) -> Path:
    """A local Hugging Face model dir: config.json with a model_type, *.safetensors, unquantized."""
    if not path.is_dir():
        if default:
            raise BadInput(f"the embedded model qverify-tiny is not installed at {path}",
                           fix="pass --model DIR, or train it with scripts/train_reference_model.py")
        raise BadInput(f"{what} dir {path} not found", fix=f"pass --{what} DIR with a Hugging Face model")
    try:
        config = json.loads((path / "config.json").read_text())
        assert isinstance(config, dict) and config.get("model_type")
    except (OSError, ValueError, AssertionError):
        raise BadInput(f"{path} is not a Hugging Face model dir (no valid config.json with model_type)",
                       fix=f"pass --{what} DIR containing config.json and *.safetensors") from None
    if not list(path.glob("*.safetensors")):
        raise BadInput(f"{path} is not a Hugging Face model dir (no *.safetensors weights)",
                       fix=f"pass --{what} DIR containing config.json and *.safetensors")
    if what == "model" and not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise BadInput(f"{path} has no tokenizer files", fix="save the tokenizer next to the model (tokenizer.save_pretrained)")
    if config.get("quantization_config"):
        raise BadInput(f"{path} is already quantized", fix=f"pass the unquantized {what} (e.g. a bf16 build's source)")
    return path.resolve()


def _resolve_drafter(model: Path, drafter: Path | None, recipe: LoadedRecipe) -> Path | None:
    if drafter is not None:
        return check_model_dir(Path(drafter).expanduser(), "drafter")
    if (model / DRAFTER_DIR / "config.json").is_file():
        return check_model_dir(model / DRAFTER_DIR, "drafter")
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


def _is_disk_full(e: BaseException) -> bool:
    if isinstance(e, OSError) and e.errno in _DISK_FULL:
        return True
    text = str(e)  # safetensors' Rust writer reports the OS error in its message
    return any(s in text for s in ("No space left", "os error 28", "File too large", "os error 27", "Disk quota"))


def _clean_stale(out: Path) -> None:
    """Remove temp dirs of earlier builds of this output whose process is gone."""
    for p in out.parent.glob(f".{out.name}.tmp-*"):
        try:
            os.kill(int(p.name.rsplit("-", 1)[1]), 0)
        except (ValueError, ProcessLookupError):
            shutil.rmtree(p, ignore_errors=True)
        except PermissionError:
            pass


def _copy_model(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for p in sorted(src.iterdir()):
        if p.is_file() and (p.name in _MODEL_FILES or p.name.endswith((".safetensors", ".safetensors.index.json"))):
            shutil.copy2(p, dst / p.name)


def _dtype_name(config: dict) -> str:
    d = str(config.get("dtype") or config.get("torch_dtype") or "bfloat16")
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(d, d)


def build(recipe: str | Path, *, model: Path | str | None = None, drafter: Path | str | None = None,
          workdir: Path | str = ".qverify", out: Path | str | None = None, calib_data: str | None = None,
          calib_samples: int | None = None, calib_seq_len: int | None = None, force: bool = False,
          on_stage: OnStage | None = None) -> BuildResult:
    """Build (or reuse) a serving build. Bad input or disk full → BadInput; a fresh build failing its load check → InfraError."""
    from qverify.assets import default_model_dir
    from qverify.quantize.calibration import load_calibration

    seconds: dict[str, float] = {}
    with _stage("resolve", on_stage, seconds):
        loaded = load_recipe(recipe)
        rec = loaded.recipe
        model_dir = check_model_dir(Path(model or default_model_dir()).expanduser(), "model", default=model is None)
        drafter_dir = _resolve_drafter(model_dir, Path(drafter) if drafter else None, loaded)
        source_hash, _ = mf.model_hash(model_dir)
        drafter_hash = mf.model_hash(drafter_dir)[0] if drafter_dir else None
        calib = None
        if rec.target or rec.drafter:
            calib = load_calibration(calib_data, calib_samples or rec.calibration.samples,
                                     calib_seq_len or rec.calibration.seq_len)
        vers = versions()
        key = {"source": source_hash, "drafter": drafter_hash, "recipe": rec.digest, "versions": vers,
               "calibration": calib.describe() | {"source": None} if calib else None}
        build_id = f"{rec.name}-{content_hash(key, 12)}"
        out_dir = Path(out).expanduser().resolve() if out else Workdir.at(workdir).build_dir(build_id)
        reused = _reuse(out_dir, build_id, force)
        if reused is not None:
            return BuildResult(out_dir, reused, reused=True, seconds=seconds)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale(out_dir)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        summary = _produce(tmp, loaded, model_dir, drafter_dir, calib, on_stage, seconds)
        with _stage("write", on_stage, seconds):
            config = json.loads((tmp / "config.json").read_text())
            kv_dtype = "fp8_e4m3" if rec.serving.kv_cache_dtype == "fp8_e4m3" else _dtype_name(config)
            by_dtype = mf.bytes_by_dtype(tmp)
            manifest = BuildManifest(
                build_id=build_id, recipe=rec.name, recipe_hash=rec.digest, recipe_text=loaded.text,
                source_model=str(model_dir), source_hash=source_hash,
                drafter=str(drafter_dir) if drafter_dir else None,
                calibration=(calib.describe() | {"used_by": [s for s in ("target", "drafter") if getattr(rec, s)],
                                                 "pipeline": rec.calibration.pipeline}) if calib else {},
                versions=vers, quantization=summary, serving=rec.serving.model_dump(mode="json"),
                bytes_by_dtype=by_dtype, total_bytes=sum(by_dtype.values()), kv_dtype=kv_dtype,
                kv_bytes_per_token=mf.kv_bytes_per_token(config, kv_dtype), tensor_hashes=mf.hash_dir(tmp),
                control=rec.control)
            manifest_path(tmp).write_text(manifest.model_dump_json(indent=2))
        with _stage("verify", on_stage, seconds):
            try:
                report = verify_build(tmp)
            except mf.IntegrityError as e:  # a fresh build that does not reload exactly is our failure, not the user's
                raise InfraError(f"the new build failed its load check and was discarded: {e}",
                                 fix="report it with the recipe and model (run with -v for the traceback)") from e
        with _stage("publish", on_stage, seconds):
            _publish(tmp, out_dir)
        report.build_dir = str(out_dir)
        return BuildResult(out_dir, manifest, reused=False, seconds=seconds, verify=report)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, Exception) and _is_disk_full(e):
            raise BadInput(f"disk full while writing the build under {out_dir.parent}; nothing was kept",
                           fix="free space, or pass --out DIR on a bigger disk") from None
        raise


def _reuse(out_dir: Path, build_id: str, force: bool) -> BuildManifest | None:
    if not out_dir.exists() or force:
        return None
    if not is_build(out_dir):
        raise BadInput(f"{out_dir} exists and is not a qverify build", fix="pass --force to replace it, or another --out")
    manifest = mf.read_manifest(out_dir)
    if manifest.build_id != build_id:
        raise BadInput(f"{out_dir} holds another build ({manifest.build_id})", fix="pass --force to replace it, or another --out")
    mf.check_hashes(out_dir, manifest)  # never hand back a tampered build as "reused"
    return manifest


def _publish(tmp: Path, out_dir: Path) -> None:
    old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
    if out_dir.exists():
        out_dir.rename(old)
    tmp.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)


def _copy_tokenizer(src: Path, fallback: Path, dst: Path) -> None:
    """Copy the tokenizer files byte for byte (the drafter falls back to the target's)."""
    files = [p for p in sorted(src.iterdir()) if p.is_file() and p.name.startswith(_TOKENIZER_PREFIXES)]
    if not files and src != fallback:
        return _copy_tokenizer(fallback, fallback, dst)
    dst.mkdir(parents=True, exist_ok=True)
    for p in files:
        shutil.copy2(p, dst / p.name)


def _produce(tmp: Path, loaded: LoadedRecipe, model_dir: Path, drafter_dir: Path | None, calib, on_stage, seconds):
    """Write the target (and drafter) checkpoints into tmp; returns the quantization summary."""
    from qverify.quantize import compress

    rec = loaded.recipe
    dataset = None
    if calib is not None:
        with _stage("calibrate", on_stage, seconds):
            from transformers import AutoTokenizer

            from qverify.quantize.calibration import to_dataset

            dataset = to_dataset(calib, AutoTokenizer.from_pretrained(model_dir))
    summary = []
    for which, src, dst in (("target", model_dir, tmp), ("drafter", drafter_dir, tmp / DRAFTER_DIR)):
        if src is None:
            continue
        stage = getattr(rec, which)
        noise = rec.corrupt.shared_expert_noise if which == "target" and rec.corrupt is not None else None
        if stage is None and noise is not None:
            with _stage("noise shared experts", on_stage, seconds):
                model = compress.load_source(src)
                compress.noise_shared_experts(model, noise, rec.corrupt.seed)
                model.save_pretrained(dst)
                del model
                gc.collect()
        elif stage is None:
            with _stage(f"copy {which}", on_stage, seconds):
                _copy_model(src, dst)
        else:
            with _stage(f"oneshot {which}", on_stage, seconds):
                model = compress.load_source(src)
                compress.quantize(model, stage, dataset, calib.seq_len, rec.calibration.pipeline,
                                  f"{loaded.path}: {which}")
                if which == "target" and rec.corrupt is not None and rec.corrupt.kv_scale_factor is not None:
                    compress.shrink_kv_scales(model, rec.corrupt.kv_scale_factor)
                if noise is not None:
                    compress.noise_shared_experts(model, noise, rec.corrupt.seed)
                counts = mf.module_counts(model)  # before saving: save compresses weights in place
                compress.save(model, dst)
                qc = json.loads((dst / "config.json").read_text()).get("quantization_config")
                summary += mf.quantization_summary(counts, qc, prefix="" if which == "target" else "drafter:")
                del model
                gc.collect()
        _copy_tokenizer(src, model_dir, dst)
    (tmp / "recipe.yaml").write_text(loaded.recipe.resolved_yaml())
    return summary
