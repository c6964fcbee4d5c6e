"""The drafter reference ("twin") of a candidate that changes its target and its drafter together: the
candidate's target with the baseline's drafter, composed from the two builds' files.

greedy/match must measure what the drafter does to greedy outputs, and the target change of such a
candidate changes them by itself (docs/gate.md, "greedy/match"); so its reference is this build, not the
baseline. Composed, not rebuilt: re-running the recipe without its drafter stage would re-calibrate the
target, which at Kimi scale (1T parameters) takes hours on GPUs, and calibration need not reproduce the
same bytes (observers, kernel order). Composing is exact by construction: the same files, hard-linked where
the filesystem allows (builds are never modified in place; a rebuild replaces the directory, which leaves
the links intact), else copied.

The id is content-addressed (the candidate's build id + the hash of the baseline's drafter tensors), so a
second call reuses the build. Its build.json is a normal manifest (recipe `<recipe>+<baseline recipe>drafter`,
recipe text and hash, tensor hashes, `composed_from`), and it passes the same load check as every build
(hashes, then a bitwise reload) before it is published under its final name.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

from qverify.errors import BadInput, InfraError
from qverify.greedy_reference import reference_kind
from qverify.models import BuildManifest, content_hash, utcnow
from qverify.quantize import manifest as mf
from qverify.quantize.build import BuildResult, OnStage, clean_stale, publish, reuse_existing
from qverify.quantize.loader import DRAFTER_DIR, verify_build
from qverify.quantize.recipe import Recipe, parse_recipe
from qverify.workdir import BUILD_MANIFEST, Workdir, manifest_path

COMPOSER_VERSION = 1  # in the id: a change to how twins are composed gets new ids
RECIPE_FILE = "recipe.yaml"


def twin_recipe(base: BuildManifest, cand: BuildManifest) -> Recipe:
    """The candidate's recipe without its drafter stage, serving the baseline's drafter as that build does."""
    rec = parse_recipe(cand.recipe_text, Path(f"{cand.recipe}.yaml")).recipe
    serving = rec.serving.model_copy(update={"draft_model_quantization": base.serving.get("draft_model_quantization")})
    changes = [c for c in rec.changes if not c.lower().startswith("drafter")]
    return Recipe.model_validate({
        **rec.model_dump(mode="json"), "name": f"{cand.recipe}+{base.recipe}drafter", "drafter": None,
        "serving": serving.model_dump(mode="json"),
        "description": f"greedy/match's reference for {cand.build_id}: its target with the drafter of {base.build_id}",
        "changes": [*changes, f"drafter: {base.recipe}'s, as build {base.build_id} carries it (composed, not rebuilt)"]})


def twin_id(base: BuildManifest, cand: BuildManifest) -> str:
    drafter = content_hash(base.part_hashes("drafter"))
    return f"{cand.recipe}+{base.recipe}drafter-{content_hash({'candidate': cand.build_id, 'drafter': drafter, 'v': COMPOSER_VERSION}, 12)}"


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:  # another filesystem (EXDEV), or one without hard links
        shutil.copy2(src, dst)


def _files(root: Path, drafter: bool) -> list[Path]:
    """A build's target files (everything but drafter/, build.json and recipe.yaml) or its drafter files."""
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if not p.is_file() or rel.parts[0].startswith("."):
            continue
        if (rel.parts[0] == DRAFTER_DIR) == drafter and (drafter or rel.as_posix() not in (BUILD_MANIFEST, RECIPE_FILE)):
            out.append(p)
    return out


def compose_twin(workdir: Path | str | Workdir, baseline: str, candidate: str, on_stage: OnStage | None = None,
                 trust_remote_code: bool = False) -> BuildResult:
    """Compose (or reuse) the candidate's twin. BadInput when the two builds cannot be composed (no drafter on
    a side, different source models); InfraError when the composed build fails its load check."""
    wd = Workdir.at(workdir)
    (base_dir, base), (cand_dir, cand) = wd.resolve_build(baseline), wd.resolve_build(candidate)
    base.remote_code(trust_remote_code), cand.remote_code(trust_remote_code)  # before anything of them loads
    ref = reference_kind(base, cand)
    if ref.kind != "twin":
        raise BadInput(f"{cand.build_id} needs no drafter reference against {base.build_id}"
                       + (f": {ref.reason}" if ref.reason else " (its target is the baseline's: the baseline is it)"),
                       fix="compose a twin only for a candidate that changes target and drafter together")
    build_id = twin_id(base, cand)
    out_dir = wd.build_dir(build_id)
    reused = reuse_existing(out_dir, build_id, force=False)
    if reused is not None:
        return BuildResult(out_dir, reused, reused=True)
    t0, seconds = time.time(), {}
    rec = twin_recipe(base, cand)
    clean_stale(out_dir)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for root, drafter in ((cand_dir, False), (base_dir, True)):
            for p in _files(root, drafter):
                _link_or_copy(p, tmp / p.relative_to(root))
        text = rec.resolved_yaml()
        (tmp / RECIPE_FILE).write_text(text)
        target_summary = [s for s in cand.quantization if not s.scheme.startswith("drafter:")]
        drafter_summary = [s for s in base.quantization if s.scheme.startswith("drafter:")]
        calib = dict(cand.calibration)
        if "used_by" in calib:
            calib["used_by"] = [u for u in calib["used_by"] if u == "target"]
        hashes = {**cand.part_hashes("target"), **base.part_hashes("drafter"),
                  f"{RECIPE_FILE}::{mf.WHOLE_FILE}": hashlib.sha256(text.encode()).hexdigest()}
        by_dtype = mf.bytes_by_dtype(tmp)
        manifest = cand.model_copy(update={
            "build_id": build_id, "recipe": rec.name, "recipe_hash": rec.digest, "recipe_text": text,
            "drafter": base.drafter, "drafter_kind": base.drafter_kind, "calibration": calib,
            "quantization": target_summary + drafter_summary, "serving": rec.serving.model_dump(mode="json"),
            "bytes_by_dtype": by_dtype, "total_bytes": sum(by_dtype.values()), "tensor_hashes": dict(sorted(hashes.items())),
            "composed_from": {"target": cand.build_id, "drafter": base.build_id}, "created": utcnow()})
        manifest_path(tmp).write_text(manifest.model_dump_json(indent=2))
        seconds["compose"] = round(time.time() - t0, 2)
        if on_stage:
            on_stage("compose", seconds["compose"])
        try:  # the hashes above are the two builds' own; the check re-reads every byte of the composed files
            report = verify_build(tmp, trust_remote_code)
        except mf.IntegrityError as e:
            raise InfraError(f"the composed drafter reference failed its load check and was discarded: {e}",
                             fix="rebuild the candidate and the baseline with --force, then rerun") from e
        seconds["verify"] = round(time.time() - t0 - seconds["compose"], 2)
        if on_stage:
            on_stage("verify", seconds["verify"])
        publish(tmp, out_dir)
        report.build_dir = str(out_dir)
        return BuildResult(out_dir, manifest, reused=False, seconds=seconds, verify=report)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
