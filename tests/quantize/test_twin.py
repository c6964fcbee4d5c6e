"""The drafter reference ("twin"): the candidate's target with the baseline's drafter, composed from real builds
(llm-compressor on the tiny model), byte for byte, verified, content-addressed."""

from __future__ import annotations

from pathlib import Path

from qverify.greedy_reference import reference_kind
from qverify.quantize.loader import verify_build
from qverify.quantize.recipe import parse_recipe
from qverify.quantize.twin import compose_twin


def _files(root: Path, drafter: bool) -> dict[str, bytes]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and rel.startswith("drafter/") == drafter and rel not in ("build.json", "recipe.yaml"):
            out[rel] = p.read_bytes()
    return out


def test_twin_is_the_candidates_target_and_the_baselines_drafter_byte_for_byte(built, workdir):
    base, cand = built("bf16"), built("fp8kv_nvfp4shared_fp8drafter")
    assert reference_kind(base.manifest, cand.manifest).kind == "twin"
    # a drafter-only candidate has the baseline's target: the baseline itself is its reference
    assert reference_kind(base.manifest, built("fp8drafter").manifest).kind == "baseline"
    assert built("fp8drafter").manifest.part_hashes("target") == base.manifest.part_hashes("target")

    twin = compose_twin(workdir, base.manifest.build_id, cand.manifest.build_id)
    assert not twin.reused and twin.verify is not None and twin.verify.ok and twin.verify.drafter_load
    d = twin.build_dir
    assert _files(d, drafter=False) == _files(cand.build_dir, drafter=False)
    assert _files(d, drafter=True) == _files(base.build_dir, drafter=True)
    assert _files(d, drafter=True) != _files(cand.build_dir, drafter=True)  # the FP8 drafter is gone
    m = twin.manifest
    assert m.part_hashes("target") == cand.manifest.part_hashes("target")
    assert m.part_hashes("drafter") == base.manifest.part_hashes("drafter")
    assert m.composed_from == {"target": cand.manifest.build_id, "drafter": base.manifest.build_id}
    assert m.recipe == "fp8kv_nvfp4shared_fp8drafter+bf16drafter" and m.kv_dtype == "fp8_e4m3"
    rec = parse_recipe(m.recipe_text, Path("x.yaml")).recipe
    assert rec.drafter is None and rec.target == parse_recipe(cand.manifest.recipe_text, Path("y.yaml")).recipe.target
    assert m.serving["draft_model_quantization"] is None and m.recipe_hash == rec.digest
    assert not any(s.scheme.startswith("drafter:") for s in m.quantization)
    assert verify_build(d).ok  # the normal load check, again from the published directory

    again = compose_twin(workdir, base.manifest.build_id, cand.manifest.build_id)
    assert again.reused and again.manifest.build_id == m.build_id  # content-addressed: reused


def test_the_gate_finds_the_twin_by_content_among_real_builds(built, workdir):
    """On real manifests: the production candidate's reference is its twin; a drafter-only candidate's is the
    baseline; a target-only candidate (FP8 KV) carries the baseline's drafter, so greedy/match is not gated."""
    from qverify.gate.reference import twin_builds
    from qverify.workdir import Workdir

    wd = Workdir.at(workdir)
    base, cand = built("bf16").manifest.build_id, built("fp8kv_nvfp4shared_fp8drafter").manifest.build_id
    twin = compose_twin(workdir, base, cand).manifest.build_id
    hits, decided = twin_builds(wd, base, cand)
    # by content, not by name: in a shared workdir the target-only build of the same target stage (fp8kv_nvfp4shared,
    # calibrated to the same bytes) qualifies as well; every hit must carry exactly that content
    assert decided is None and twin in hits
    cm, bm = wd.build_manifest(cand), wd.build_manifest(base)
    for h in hits:
        m = wd.build_manifest(h)
        assert m.part_hashes("target") == cm.part_hashes("target") and m.part_hashes("drafter") == bm.part_hashes("drafter")
    assert twin_builds(wd, base, built("fp8drafter").manifest.build_id) == ([base], None)
    hits, decided = twin_builds(wd, base, built("fp8kv").manifest.build_id)
    assert hits == [] and decided is not None and decided.not_applicable


def test_one_rule_decides_the_reference_for_the_composer_and_the_gate(built, workdir):
    """reference_kind is what pipeline.ensure_twins, compose_twin and the gate's search all ask: its four outcomes
    on a real manifest with its tensor hashes edited, and each consumer acting on the outcome (not on a copy of
    the rule). A candidate with no drafter against a baseline with one used to reach the gate's search (no twin,
    a fix that composed nothing) while the composer skipped it; now both say why no reference can exist."""
    import pytest

    from qverify.errors import BadInput
    from qverify.gate.reference import twin_builds
    from qverify.models import BuildManifest
    from qverify.workdir import Workdir

    base = built("bf16").manifest

    def variant(name: str, target: str | None, drafter: str | None, source: str | None = None) -> BuildManifest:
        h = {k: (target or v) if not k.startswith("drafter/") else (drafter or v)
             for k, v in base.tensor_hashes.items() if drafter != "" or not k.startswith("drafter/")}
        m = base.model_copy(update={"build_id": name, "tensor_hashes": h, "source_hash": source or base.source_hash})
        d = Workdir.at(workdir).build_dir(name)
        d.mkdir(parents=True, exist_ok=True)
        (d / "build.json").write_text(m.model_dump_json())
        return m

    cases = {
        "same-target": (variant("same-target", None, "d2"), "baseline"),
        "same-drafter": (variant("same-drafter", "t2", None), "not_gated"),
        "both": (variant("both", "t2", "d2"), "twin"),
        "no-drafter": (variant("no-drafter", "t2", ""), "none"),
        "other-source": (variant("other-source", "t2", "d2", source="s2"), "none"),
    }
    wd = Workdir.at(workdir)
    for name, (m, kind) in cases.items():
        ref = reference_kind(base, m)
        assert ref.kind == kind, name
        hits, decided = twin_builds(wd, base.build_id, name)
        if kind == "baseline":
            assert (hits, decided) == ([base.build_id], None)
        elif kind == "twin":
            assert decided is None  # searched (no composed twin here: hits may be empty)
        else:
            assert hits == [] and decided is not None and (decided.not_applicable or decided.refusal) == ref.reason
            assert (decided.refusal is not None) == (kind == "none")
            with pytest.raises(BadInput):
                compose_twin(workdir, base.build_id, name)
    assert "no drafter" in reference_kind(base, cases["no-drafter"][0]).reason
